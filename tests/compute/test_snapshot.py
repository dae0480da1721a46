"""The researcher's code ships with a job whose ranks do not see the launcher's disk (issue 25):
what a snapshot of the launch directory holds and leaves out, its digest, its size limit, and a
job on ``compute=elsewhere`` that imports a package found only in the launch directory."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import ddlkit
from ddlkit.compute.snapshot import CodeSnapshot, imports_from
from ddlkit.testing import RunFactory

MB = 1_000_000


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def paths(snapshot: CodeSnapshot) -> list[str]:
    return [path for path, _ in snapshot.files]


def test_a_snapshot_holds_the_code_and_leaves_out_debris_outputs_and_what_is_ignored(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "project",
        {
            "my_pkg/__init__.py": "",
            "my_pkg/nets.py": "def build(): ...\n",
            "my_pkg/config.yaml": "depth: 4\n",
            "train.py": "",
            "README.md": "",
            # debris and outputs, left out whatever the ignore files say
            ".git/HEAD": "ref",
            "my_pkg/__pycache__/nets.cpython-311.pyc": b"\0",
            "my_pkg/nets.pyc": b"\0",
            ".venv/bin/python": "",
            "outputs/2026-11-25/10-00-00/result.json": "{}",
            "multirun/x/0/ledger.json": "{}",
            "mine.egg-info/PKG-INFO": "",
            # a job directory anywhere in the tree is output, not code
            "runs/first/job.json": "{}",
            "runs/first/rank-0.log": "",
            # .gitignore applies below its own directory; .ddlkitignore at the top, with ! to take a file back
            ".gitignore": "*.ckpt\n",
            "my_pkg/.gitignore": "scratch/\n",
            "my_pkg/scratch/tmp.py": "",
            "data/big.npy": b"\0" * 10,
            "data/labels.csv": "",
            "weights.ckpt": b"\0",
            ".ddlkitignore": "data/\n",
            "notes/.gitignore": "*.md\n!keep.md\n",
            "notes/drop.md": "",
            "notes/keep.md": "",
        },
    )
    snapshot = CodeSnapshot.take(root, max_bytes=MB, exclude=["README.md"])
    assert paths(snapshot) == [
        ".ddlkitignore",
        ".gitignore",
        "my_pkg/.gitignore",
        "my_pkg/__init__.py",
        "my_pkg/config.yaml",
        "my_pkg/nets.py",
        "notes/.gitignore",
        "notes/keep.md",
        "train.py",
    ]
    assert snapshot.size == sum((root / p).stat().st_size for p in paths(snapshot))


def test_the_job_directory_is_never_in_its_own_snapshot(tmp_path: Path) -> None:
    root = tree(tmp_path, {"my_pkg/__init__.py": "", "outside/job/config.yaml": ""})
    assert paths(CodeSnapshot.take(root, max_bytes=MB, skip=[root / "outside" / "job"])) == ["my_pkg/__init__.py"]


def test_the_digest_follows_content_and_names_not_time_or_place(tmp_path: Path) -> None:
    files = {"my_pkg/__init__.py": "", "my_pkg/nets.py": "def build(): ...\n"}
    one = CodeSnapshot.take(tree(tmp_path / "a", files), max_bytes=MB)
    two = CodeSnapshot.take(tree(tmp_path / "b", files), max_bytes=MB)
    assert one.digest == two.digest and len(one.digest) == 64
    (tmp_path / "b" / "my_pkg" / "nets.py").write_text("def build(): return 1\n")
    assert CodeSnapshot.take(tmp_path / "b", max_bytes=MB).digest != one.digest
    (tmp_path / "a" / "my_pkg" / "nets.py").rename(tmp_path / "a" / "my_pkg" / "models.py")
    assert CodeSnapshot.take(tmp_path / "a", max_bytes=MB).digest != one.digest


def test_over_the_limit_is_one_error_naming_the_biggest_files_and_the_fixes(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "project",
        {
            "my_pkg/__init__.py": "",
            "data/train.npy": b"\0" * 700_000,
            "data/val.npy": b"\0" * 400_000,
            "notes.txt": "x",
        },
    )
    with pytest.raises(ddlkit.ConfigError) as info:
        CodeSnapshot.take(root, max_bytes=MB)
    assert str(info.value) == (
        f"the code snapshot of {root} is 1.1 MB in 4 files, over code.max_mb=1; the biggest: data/train.npy "
        "(700.0 kB), data/val.npy (400.0 kB), notes.txt (1 B), my_pkg/__init__.py (0 B). Leave data and outputs "
        "out with a .ddlkitignore (gitignore syntax) or code.exclude=[...], or raise code.max_mb."
    )
    assert paths(CodeSnapshot.take(root, max_bytes=MB, exclude=["*.npy"])) == ["my_pkg/__init__.py", "notes.txt"]


def test_written_into_the_job_directory_with_its_manifest(tmp_path: Path) -> None:
    root = tree(tmp_path / "project", {"my_pkg/__init__.py": "", "my_pkg/nets.py": "x = 1\n"})
    snapshot = CodeSnapshot.take(root, max_bytes=MB)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "code" / "stale.py").parent.mkdir()
    (job_dir / "code" / "stale.py").write_text("")  # an earlier run's snapshot is replaced, not merged
    assert snapshot.write(job_dir) == job_dir / "code"
    assert sorted(p.relative_to(job_dir / "code").as_posix() for p in (job_dir / "code").rglob("*.py")) == [
        "my_pkg/__init__.py",
        "my_pkg/nets.py",
    ]
    manifest = json.loads((job_dir / "code.json").read_text())
    assert manifest == {
        "digest": snapshot.digest,
        "size": 6,
        "files": [{"path": "my_pkg/__init__.py", "size": 0}, {"path": "my_pkg/nets.py", "size": 6}],
    }
    assert str(tmp_path) not in (job_dir / "code.json").read_text()


def test_only_import_paths_into_the_launch_directory_need_it(tmp_path: Path) -> None:
    tree(tmp_path, {"my_pkg/__init__.py": "", "my_pkg/nets.py": "", "losses.py": ""})
    named = [
        ("model.target", "my_pkg.nets:build"),
        ("model.loss", "losses:focal"),
        ("data.target", "ddlkit.testing.optim:linear_data"),
        ("trainer.callbacks[0]", "json:loads"),
    ]
    assert imports_from(tmp_path, named) == named[:2]


DATA = '''
import numpy as np


def samples(split, n=32):
    """4x4 RGB images of 3 classes, as a researcher's own package would give them."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    return rng.uniform(0, 1, (n, 4, 4, 3)).astype("float32"), rng.integers(0, 3, n)
'''
USER_DATA = (
    "data=custom",
    "data.target=my_pkg.data:samples",
    "data.num_classes=3",
    "data.image_size=4",
    "trainer.batch_size=8",
    "trainer.epochs=1",
    "trainer.log_every=2",
)


@pytest.mark.slow
def test_a_package_only_in_the_launch_directory_trains_elsewhere(run_factory: RunFactory, tmp_path: Path) -> None:
    tree(tmp_path, {"my_pkg/__init__.py": "", "my_pkg/data.py": textwrap.dedent(DATA), "big.bin": b"\0" * 2000})
    (tmp_path / ".ddlkitignore").write_text("*.bin\n")
    cluster = tmp_path / "cluster"
    outcome = run_factory(*USER_DATA, "compute=elsewhere", f"compute.root={cluster}").assert_success()
    assert outcome.result["steps"] == 4
    # it reached the job as the snapshot: the files, their listing, and no launcher path in the environment
    manifest = json.loads((outcome.job_dir / "code.json").read_text())
    assert [f["path"] for f in manifest["files"]] == [".ddlkitignore", "my_pkg/__init__.py", "my_pkg/data.py"]
    remote = next(cluster.iterdir())
    assert (remote / "code" / "my_pkg" / "data.py").read_text() == textwrap.dedent(DATA)
    assert "DDLKIT_LAUNCH_DIR" not in (outcome.job_dir / "job.json").read_text()


@pytest.mark.slow
def test_plan_lists_what_would_ship(run_factory: RunFactory, tmp_path: Path) -> None:
    tree(tmp_path, {"my_pkg/__init__.py": "", "my_pkg/data.py": textwrap.dedent(DATA), ".env": "API_KEY=x\n"})
    (tmp_path / "environ").symlink_to("/proc/self/environ")
    outcome = run_factory.cli(
        "plan",
        *USER_DATA,
        "compute=elsewhere",
        f"compute.root={tmp_path / 'cluster'}",
        f"hydra.run.dir={tmp_path / 'job'}",
    ).assert_success()
    snapshot = CodeSnapshot.take(tmp_path, max_bytes=MB)
    assert snapshot.describe() == f"2 files, {len(textwrap.dedent(DATA))} B, sha256 {snapshot.digest[:12]}"
    assert (
        f"      code: a snapshot of the launch directory ships with the job ({snapshot.describe()}): "
        "my_pkg/__init__.py, my_pkg/data.py; left out as credentials: .env (to ship one, add !<path> to "
        ".ddlkitignore); symbolic links out of the tree, not followed: environ -> /proc/self/environ\n"
    ) in outcome.stdout
    assert not (tmp_path / "job" / "code").exists()  # a plan writes nothing


@pytest.mark.slow
def test_over_the_limit_the_job_is_refused_before_it_is_submitted(run_factory: RunFactory, tmp_path: Path) -> None:
    tree(tmp_path, {"my_pkg/__init__.py": "", "my_pkg/data.py": textwrap.dedent(DATA), "data.npy": b"\0" * 3000})
    outcome = run_factory(
        *USER_DATA, "compute=elsewhere", f"compute.root={tmp_path / 'cluster'}", "code.max_mb=0.001"
    ).assert_returncode(2)
    assert "the code snapshot of" in outcome.stderr and "data.npy (3.0 kB)" in outcome.stderr
    assert not (tmp_path / "cluster").exists()


def test_credential_files_stay_behind_and_are_named_unless_taken_back(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "project",
        {
            "my_pkg/__init__.py": "",
            "my_pkg/id_utils.py": "",
            "train.py": "",
            ".env": "WANDB_API_KEY=x\n",
            ".env.local": "A=1\n",
            "deploy/server.pem": "-----BEGIN",
            "tls.key": "k",
            "cert.p12": b"\0",
            "home/.netrc": "machine x password y",
            ".git-credentials": "https://u:p@h",
            "gcp/credentials-prod.json": "{}",
            ".ssh/id_ed25519": "k",
            "keys/id_rsa": "k",
            ".aws/credentials": "k",
            "home/.config/gcloud/application_default_credentials.json": "{}",
            ".kube/config": "k",
            ".azure/accessTokens.json": "{}",
            ".pypirc": "password = x",
        },
    )
    snapshot = CodeSnapshot.take(root, max_bytes=MB)
    assert paths(snapshot) == ["my_pkg/__init__.py", "my_pkg/id_utils.py", "train.py"]
    assert snapshot.withheld == (
        ".aws/",
        ".azure/",
        ".env",
        ".env.local",
        ".git-credentials",
        ".kube/",
        ".pypirc",
        ".ssh/",
        "cert.p12",
        "deploy/server.pem",
        "gcp/credentials-prod.json",
        "home/.config/gcloud/",
        "home/.netrc",
        "keys/id_rsa",
        "tls.key",
    )
    assert snapshot.left_out()[0].startswith("left out as credentials: .aws/, .azure/, .env, ")
    assert snapshot.left_out()[0].endswith("(to ship one, add !<path> to .ddlkitignore)")
    # taken back on purpose, by path
    (root / ".ddlkitignore").write_text("!deploy/server.pem\n")
    again = CodeSnapshot.take(root, max_bytes=MB)
    assert "deploy/server.pem" in paths(again) and "deploy/server.pem" not in again.withheld


def test_links_out_of_the_tree_are_not_followed_and_links_inside_ship_as_links(tmp_path: Path) -> None:
    root = tree(tmp_path / "project", {"my_pkg/__init__.py": "", "my_pkg/nets.py": "x = 1\n", "conf/a.yaml": "a\n"})
    (tmp_path / "secret.txt").write_text("the launcher's secret")
    (root / "environ").symlink_to("/proc/self/environ")
    (root / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (root / "home").symlink_to(tmp_path)  # a directory outside
    (root / "gone.py").symlink_to(root / "missing.py")
    (root / "my_pkg" / "alias.py").symlink_to("nets.py")
    (root / "configs").symlink_to(root / "conf")  # absolute, inside: shipped relative
    snapshot = CodeSnapshot.take(root, max_bytes=MB)
    assert paths(snapshot) == ["conf/a.yaml", "my_pkg/__init__.py", "my_pkg/nets.py"]
    assert snapshot.links == (("configs", "conf"), ("my_pkg/alias.py", "nets.py"))
    assert snapshot.outside_links == (
        ("environ", "/proc/self/environ"),
        ("gone.py", str(root / "missing.py")),
        ("home", str(tmp_path)),
        ("leak.txt", str(tmp_path / "secret.txt")),
    )
    assert snapshot.left_out() == [
        "symbolic links out of the tree, not followed: environ -> /proc/self/environ, "
        f"gone.py -> {root / 'missing.py'}, home -> {tmp_path}, "
        f"leak.txt -> {tmp_path / 'secret.txt'}"
    ]
    code = snapshot.write(tmp_path / "job")
    assert (code / "my_pkg" / "alias.py").is_symlink() and (code / "my_pkg" / "alias.py").read_text() == "x = 1\n"
    assert (code / "configs" / "a.yaml").read_text() == "a\n"
    assert not (code / "environ").exists() and not (code / "leak.txt").exists()
    shipped = "".join(p.read_text(errors="replace") for p in code.rglob("*") if p.is_file())
    assert "secret" not in shipped
    # a link is part of the digest: retargeting it changes the snapshot
    (root / "my_pkg" / "alias.py").unlink()
    (root / "my_pkg" / "alias.py").symlink_to("__init__.py")
    assert CodeSnapshot.take(root, max_bytes=MB).digest != snapshot.digest


def test_sizes_are_checked_before_any_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "project", {"my_pkg/__init__.py": ""})
    with open(root / "huge.bin", "wb") as f:  # 3 GB, sparse: nothing to read but its size
        f.truncate(3 * 10**9)
    opened: list[str] = []
    real_open = open

    def recording_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", recording_open)
    with pytest.raises(ddlkit.ConfigError, match=r"huge.bin \(3.0 GB\)"):
        CodeSnapshot.take(root, max_bytes=50 * MB)
    assert not [p for p in opened if p.endswith("huge.bin")]


def test_an_unreadable_file_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    root = tree(tmp_path / "project", {"my_pkg/__init__.py": "", "bad_sector.py": "x"})
    real_open = open

    def failing_open(file, *args, **kwargs):  # what a disk with a bad sector answers
        if str(file).endswith("bad_sector.py"):
            raise OSError(errno.EIO, "Input/output error")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(ddlkit.ConfigError) as caught:
        CodeSnapshot.take(root, max_bytes=MB)
    assert str(caught.value) == (
        f"the code snapshot cannot read {root / 'bad_sector.py'}: Input/output error. Leave "
        "it out with a .ddlkitignore line or code.exclude=[...], or make it readable."
    )
