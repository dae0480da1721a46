"""storage=local: the storage contract, plus what is specific to a directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit import ConfigError, StorageBackend
from ddlkit.builtin.local_storage import LocalStorage, LocalStorageConfig
from ddlkit.jobdir import RESULT_FILE, RESULT_FILES
from ddlkit.testing.contracts import StorageBackendContract


class TestLocalStorage(StorageBackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> StorageBackend:
        return LocalStorage(LocalStorageConfig(root=str(tmp_path / "store")))


def test_without_a_root_there_is_nowhere_to_put_objects(tmp_path: Path) -> None:
    storage = LocalStorage(LocalStorageConfig())
    assert storage.list() == []
    with pytest.raises(ConfigError) as info:
        storage.put(tmp_path / "x", "x")
    assert str(info.value) == "storage=local has no storage.root; set storage.root=<directory> to store objects"


def test_objects_are_plain_files_under_the_root(tmp_path: Path) -> None:
    storage = LocalStorage(LocalStorageConfig(root=str(tmp_path / "store")))
    (tmp_path / "f").write_text("data")
    storage.put(tmp_path / "f", "a/b/c.txt")
    assert (tmp_path / "store" / "a" / "b" / "c.txt").read_text() == "data"


def test_leftovers_of_an_interrupted_put_are_not_listed(tmp_path: Path) -> None:
    storage = LocalStorage(LocalStorageConfig(root=str(tmp_path)))
    leftover = tmp_path / "a" / ".c.txt.x1y2.tmp"
    leftover.mkdir(parents=True)
    (leftover / "c.txt").write_text("half")
    (tmp_path / "a" / "d.txt").write_text("whole")
    assert storage.list() == ["a/d.txt"]


def test_publish_results_copies_the_result_files(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    for name in (*RESULT_FILES, "rank-0.log"):
        (job_dir / name).write_text(name)
    storage = LocalStorage(LocalStorageConfig(root=str(tmp_path / "store")))
    assert storage.publish_results(job_dir, "run-1") == str(tmp_path / "store" / "results" / "run-1")
    assert storage.list("results/") == sorted(f"results/run-1/{name}" for name in RESULT_FILES)
    assert LocalStorage(LocalStorageConfig()).publish_results(job_dir, "run-1") is None


def test_result_json_is_published_last(tmp_path: Path) -> None:
    """A result.json at the destination means the other files arrived (as with the other storages)."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    for name in RESULT_FILES:
        (job_dir / name).write_text(name)
    puts: list[str] = []

    class Recording(LocalStorage):
        def put(self, local_path: Path, key: str) -> None:
            puts.append(key)
            super().put(local_path, key)

    Recording(LocalStorageConfig(root=str(tmp_path / "store"))).publish_results(job_dir, "run-1")
    assert puts[-1] == f"results/run-1/{RESULT_FILE}" and len(puts) == len(RESULT_FILES)
