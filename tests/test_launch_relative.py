"""Paths given relative to where ``ddlkit`` was started (issue 37, item 14): the ranks run in the job
directory, so the launcher makes ``data.root`` and a ``trainer.resume`` checkpoint absolute for ranks
on its own disk -- except where a relative path means something else on the nodes (storage=nfs:
below its mount)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit.launch.cli import main
from ddlkit.testing import FAKES_MODULE
from ddlkit.testing.images import make_image_dataset

IMAGES = [
    "framework=fake",
    "data=imagefolder",
    "data.root=imgs",
    "data.image_size=8",
    "data.workers=0",
    "trainer.batch_size=4",
    "trainer.epochs=1",
    "trainer.validate=false",
]


@pytest.fixture
def launch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDLKIT_PLUGINS", FAKES_MODULE)
    monkeypatch.chdir(tmp_path)
    make_image_dataset(tmp_path / "imgs", classes=2, train_per_class=4, val_per_class=1)
    return tmp_path


def job_config(job_dir: Path) -> dict:
    return json.loads((job_dir / "job.json").read_text())["config"]


def test_a_relative_data_root_is_read_from_where_ddlkit_was_started(launch_dir: Path) -> None:
    assert main([*IMAGES, "hydra.run.dir=runs/a"]) == 0
    assert job_config(launch_dir / "runs" / "a")["data"]["root"] == str(launch_dir / "imgs")
    assert json.loads((launch_dir / "runs" / "a" / "result.json").read_text())["steps"] == 2
    # and a checkpoint to resume from, named relative to here too
    assert main([*IMAGES, "trainer.resume=runs/a", "hydra.run.dir=runs/b"]) == 0
    assert job_config(launch_dir / "runs" / "b")["trainer"]["resume"] == str(launch_dir / "runs" / "a")
    assert json.loads((launch_dir / "runs" / "b" / "result.json").read_text())["resumed_from_step"] == 2


def test_urls_absolute_paths_and_nfs_roots_are_left_as_they_are(launch_dir: Path) -> None:
    from ddlkit.builtin.local_storage import LocalStorage, LocalStorageConfig
    from ddlkit.builtin.nfs_storage import NfsStorage, NfsStorageConfig

    # storage=nfs: a relative data.root is the share's, below storage.root on every node
    nfs = NfsStorage(NfsStorageConfig(root="/mnt/nfs"))
    assert nfs.launch_relative("imagenet", launch_dir) == "/mnt/nfs/imagenet"
    assert nfs.launch_relative("/data/imagenet", launch_dir) == "/data/imagenet"
    storage = LocalStorage(LocalStorageConfig())
    for root in ("blob://datasets/imagenet", "file:///data/imagenet", "/data/imagenet"):
        assert storage.launch_relative(root, launch_dir) == root
    assert storage.launch_relative("~/imagenet", launch_dir) == "~/imagenet"
    assert storage.launch_relative("data/imagenet", launch_dir) == str(launch_dir / "data" / "imagenet")


def test_a_relative_data_root_with_storage_nfs_is_read_below_the_share(launch_dir: Path) -> None:
    """Issue 37, item 14: ``data.root=imgs storage=nfs`` failed with "data.root=imgs is not a
    directory on this node": the image folder's index read the root as given, before the storage
    put it below its mount point."""
    share = launch_dir / "share"
    share.mkdir()
    (launch_dir / "imgs").rename(share / "imgs")
    assert main([*IMAGES, "storage=nfs", f"storage.root={share}", "hydra.run.dir=runs/nfs"]) == 0
    assert job_config(launch_dir / "runs" / "nfs")["data"]["root"] == str(share / "imgs")
    assert json.loads((launch_dir / "runs" / "nfs" / "result.json").read_text())["steps"] == 2
