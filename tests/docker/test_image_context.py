"""ddlkit.compute.containers.image_context: what a service that builds images itself (an Azure ML
workspace) gets of a checkout -- the files .dockerignore lets in, read by Docker's rules, the Dockerfile
with the build arguments written in -- and a digest that changes exactly when one of them does."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlkit
from ddlkit.compute import containers
from ddlkit.compute._dockerignore import DockerIgnore
from ddlkit.compute.containers import DOCKERFILE, image_context

from .conftest import DOCKERFILE as REPO_DOCKERFILE


def let_in(patterns: str, paths: list[str]) -> list[str]:
    ignore = DockerIgnore(patterns.splitlines())
    return [path for path in paths if not ignore.excludes(path)]


# the tests marked plugins build the context of ddlkit-pytorch's, ddlkit-tensorflow's or ddlkit-keras's image: ddlkit's
# images are those of the frameworks whose plugins say they have one (containers.release_frameworks)


# ---------------------------------------------------------------------------- .dockerignore, as Docker reads it
@pytest.mark.parametrize(
    ("patterns", "paths", "kept"),
    [
        # an allowlist: "*" is every top-level name, and what it matches takes everything below along
        (
            "*\n!ddlkit/\n!README.md",
            ["ddlkit/a.py", "ddlkit/sub/b.py", "README.md", "tests/t.py", "setup.cfg"],
            ["ddlkit/a.py", "ddlkit/sub/b.py", "README.md"],
        ),
        # anchored at the root, unlike .gitignore: "*.md" is the top level's only
        ("*.md", ["README.md", "docs/guide.md"], ["docs/guide.md"]),
        # "**" spans any number of directories, none included
        (
            "**/__pycache__",
            ["__pycache__/a.pyc", "ddlkit/__pycache__/a.pyc", "ddlkit/x/__pycache__/b.pyc", "ddlkit/a.py"],
            ["ddlkit/a.py"],
        ),
        # "*" stays within one segment
        (
            "plugins/*/tests",
            ["plugins/p/tests/t.py", "plugins/p/src/tests.py", "plugins/p/q/tests/t.py"],
            ["plugins/p/src/tests.py", "plugins/p/q/tests/t.py"],
        ),
        # the last pattern that matches decides (Docker's documented example)
        ("*.md\n!README*.md\nREADME-secret.md", ["CHANGES.md", "README.md", "README-secret.md"], ["README.md"]),
        ("temp?\n/build\n# a comment\n\n[!a]bc", ["temp1", "temp12", "build/x", "xbc", "abc"], ["temp12", "abc"]),
    ],
)
def test_dockerignore_patterns_follow_dockers_rules(patterns: str, paths: list[str], kept: list[str]) -> None:
    assert let_in(patterns, paths) == kept


def test_an_exception_below_an_excluded_directory_is_found(tmp_path: Path) -> None:
    for rel in ("docs/keep.md", "docs/drop.md", "docs/sub/deep.md", ".git/config"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert list(DockerIgnore(["docs", "!docs/keep.md", "!**/deep.md", ".git"]).files(tmp_path)) == [
        "docs/keep.md",
        "docs/sub/deep.md",
    ]


# ---------------------------------------------------------------------------- the context of ddlkit's image
@pytest.mark.plugins
def test_the_context_is_what_dockerignore_lets_in_of_the_checkout() -> None:
    context = image_context("pytorch")
    assert context.root == REPO_DOCKERFILE.parents[1]
    tops = {path.split("/")[0] for path in context.files}
    assert tops == {"pyproject.toml", "ddlkit", "hydra_plugins", "plugins", "scripts"}
    # no README: nothing installed needs one (setuptools builds without the file pyproject.toml names)
    assert not [p for p in context.files if p.rsplit("/", 1)[-1] == "README.md"]
    assert {"ddlkit/__init__.py", "plugins/ddlkit-pytorch/pyproject.toml", "scripts/install_horovod.sh"} <= set(
        context.files
    )
    assert not [
        p
        for p in context.files
        if "/tests/" in p
        and p.startswith("plugins/")
        or "__pycache__" in p
        or p.endswith(".egg-info")
        or p.startswith("scripts/")
        and p != "scripts/install_horovod.sh"
    ]
    assert context.size > sum((context.root / p).stat().st_size for p in context.files)  # and the Dockerfile


@pytest.mark.parametrize(("framework", "gpu"), [("pytorch", True), ("tensorflow", False), ("keras", True)])
@pytest.mark.plugins
def test_the_build_arguments_are_written_into_the_dockerfile(framework: str, gpu: bool) -> None:
    """An Azure ML build context takes no build arguments: they become the Dockerfile's defaults."""
    context = image_context(framework, gpu=gpu)
    variant = "cuda" if gpu else "cpu"
    assert context.build_args == {"FRAMEWORK": framework, "VARIANT": variant}
    original = REPO_DOCKERFILE.read_text().splitlines()
    written = context.dockerfile.splitlines()
    changed = [(a, b) for a, b in zip(original, written, strict=True) if a != b]
    assert [b for _, b in changed] == [
        line for line in (f"ARG FRAMEWORK={framework}", f"ARG VARIANT={variant}") if line not in original
    ]


@pytest.mark.plugins
def test_the_context_of_the_image_with_horovod_says_so() -> None:
    """dist=horovod's image (an Azure ML environment of its own): HOROVOD=1 written in, another digest."""
    context = image_context("tensorflow", gpu=False, horovod=True)
    assert context.build_args == {"FRAMEWORK": "tensorflow", "VARIANT": "cpu", "HOROVOD": "1"}
    assert "\nARG HOROVOD=1\n" in context.dockerfile and "\nARG HOROVOD=0\n" in REPO_DOCKERFILE.read_text()
    assert context.digest != image_context("tensorflow", gpu=False).digest
    assert context.files == image_context("tensorflow", gpu=False).files


@pytest.mark.plugins
def test_the_digest_changes_with_what_goes_in_and_only_with_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = image_context("pytorch")
    assert image_context("pytorch").digest == context.digest
    assert image_context("pytorch", gpu=False).digest != context.digest
    # a context written out is a checkout of its own, with the same digest
    checkout = context.write(tmp_path / "checkout")
    assert sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*") if p.is_file()) == sorted(
        [*context.files, ".dockerignore", DOCKERFILE]
    )
    monkeypatch.setattr(containers, "CHECKOUT", checkout)
    assert image_context("pytorch").digest == context.digest
    (checkout / "plugins" / "ddlkit-pytorch" / "tests").mkdir()
    (checkout / "plugins" / "ddlkit-pytorch" / "tests" / "test_more.py").write_text("assert True\n")
    (checkout / "notes.txt").write_text("not in the image\n")
    # documentation, edited far more often than the code, makes no new image
    (checkout / "README.md").write_text((REPO_DOCKERFILE.parents[1] / "README.md").read_text() + "\nedited\n")
    (checkout / "plugins" / "ddlkit-pytorch" / "README.md").write_text("edited\n")
    assert image_context("pytorch").digest == context.digest
    (checkout / "ddlkit" / "_version.py").write_text(f'__version__ = "{ddlkit.__version__}"  # changed\n')
    assert image_context("pytorch").digest != context.digest


@pytest.mark.plugins
def test_an_installation_without_its_checkout_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containers, "CHECKOUT", tmp_path / "site-packages")
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"ddlkit's image is built from docker/Dockerfile of a ddlkit "
        r"checkout, and this ddlkit is installed without one .*"
        r"\(pip install -e <checkout>\), or set compute\.image",
    ):
        image_context("pytorch")


@pytest.mark.plugins
def test_a_dockerfile_without_the_argument_to_set_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = image_context("pytorch").write(tmp_path / "checkout")
    dockerfile = checkout / DOCKERFILE
    dockerfile.write_text(dockerfile.read_text().replace("ARG VARIANT=cuda\n", "ARG VARIANT\n"))
    monkeypatch.setattr(containers, "CHECKOUT", checkout)
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"docker/Dockerfile has no line `ARG VARIANT=<default>` to set "
        r"VARIANT=cpu in: restore it",
    ):
        image_context("pytorch", gpu=False)


def test_a_framework_without_an_image_has_no_context() -> None:
    with pytest.raises(ddlkit.ConfigError, match="ddlkit builds no image for framework=jax"):
        image_context("jax")
