"""storage=nfs and storage=local_ssd: the storage contract, staging (verified, resumable, reused,
refusing a too-small disk), publishing results (retried, result.json last), and whole runs."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ddlkit import ConfigError, RunError, StorageBackend
from ddlkit.builtin.local_ssd_storage import LocalSsdStorage
from ddlkit.builtin.local_storage import LocalStorage, LocalStorageConfig
from ddlkit.builtin.nfs_storage import NfsStorage, NfsStorageConfig
from ddlkit.launch.prepare import job_name
from ddlkit.storage import (
    LocalSsdConfig,
    Manifest,
    TransientStorageError,
    build_manifest,
    dataset_dirname,
    is_staged,
    publish_files,
    result_files,
    stage,
)
from ddlkit.testing.contracts import StorageBackendContract
from ddlkit.testing.images import ImageDataset, make_image_dataset


class TestNfsStorage(StorageBackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> StorageBackend:
        (tmp_path / "share").mkdir()
        return NfsStorage(NfsStorageConfig(root=str(tmp_path / "share")))


class TestLocalSsdStorage(StorageBackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> StorageBackend:
        return LocalSsdStorage(LocalSsdConfig(scratch=str(tmp_path / "scratch"), results=str(tmp_path / "results")))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    ds = make_image_dataset(
        tmp_path_factory.mktemp("share") / "imagenet", classes=3, train_per_class=6, val_per_class=2, odd_files=True
    )
    build_manifest(ds.root).write(ds.root / "manifest.tsv")
    return ds


def _copy(ds: ImageDataset, dest: Path) -> Path:
    shutil.copytree(ds.root, dest)
    return dest


class Flaky(LocalStorage):
    """A directory whose get/put fail now and then, as a network store does."""

    def __init__(self, root: Path, *, fail_every: int = 0, fail_keys: tuple[str, ...] = (), transient: int = 0) -> None:
        super().__init__(LocalStorageConfig(root=str(root)))
        self.fail_every, self.fail_keys, self.transient, self.calls = fail_every, fail_keys, transient, 0
        self.gets: list[str] = []
        self.puts: list[str] = []

    def _maybe_fail(self, key: str) -> None:
        self.calls += 1
        if any(key.endswith(k) for k in self.fail_keys):
            raise TransientStorageError(f"simulated outage on {key}")
        if self.transient:
            self.transient -= 1
            raise TransientStorageError(f"simulated timeout on {key}")
        if self.fail_every and self.calls % self.fail_every == 0:
            raise KeyboardInterrupt  # an interruption mid-staging (Ctrl-C, preemption)

    def get(self, key: str, local_path: Path) -> None:
        self._maybe_fail(key)
        super().get(key, local_path)
        self.gets.append(key)

    def put(self, local_path: Path, key: str) -> None:
        self._maybe_fail(key)
        super().put(local_path, key)
        self.puts.append(key)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)


# ---------------------------------------------------------------------------- staging
def test_staging_copies_verifies_and_a_second_staging_transfers_nothing(dataset: ImageDataset, tmp_path: Path) -> None:
    manifest = Manifest.read(dataset.root / "manifest.tsv")
    first = stage(LocalStorage(LocalStorageConfig(root=str(dataset.root))), tmp_path / "copy", describe="share")
    assert (first.files_transferred, first.bytes_transferred, first.reused) == (
        len(manifest),
        manifest.total_bytes,
        False,
    )
    for e in manifest.entries:
        assert (tmp_path / "copy" / e.path).read_bytes() == (dataset.root / e.path).read_bytes()
    assert build_manifest(tmp_path / "copy").dumps() == manifest.dumps()  # the .ddlkit state folder is not data
    second = stage(LocalStorage(LocalStorageConfig(root=str(dataset.root))), tmp_path / "copy", describe="share")
    assert (second.files_transferred, second.bytes_transferred, second.reused) == (0, 0, True)


def test_an_interrupted_staging_resumes_where_it_stopped(dataset: ImageDataset, tmp_path: Path) -> None:
    n = len(Manifest.read(dataset.root / "manifest.tsv"))
    source = Flaky(dataset.root, fail_every=10)
    with pytest.raises(KeyboardInterrupt):
        stage(source, tmp_path / "copy", describe="share", workers=1)
    done = len(source.gets) - 1  # the manifest
    assert 0 < done < n and not is_staged(tmp_path / "copy")
    resumed = Flaky(dataset.root)
    report = stage(resumed, tmp_path / "copy", describe="share")
    assert report.files_transferred == n - done
    assert sorted(resumed.gets[1:]) == sorted(set(resumed.gets[1:])) and len(resumed.gets) - 1 == n - done


def test_transient_errors_are_retried_and_a_bad_copy_is_refused(dataset: ImageDataset, tmp_path: Path) -> None:
    report = stage(Flaky(dataset.root, transient=3), tmp_path / "a", describe="share")
    assert not report.reused
    src = _copy(dataset, tmp_path / "src")
    victim = Manifest.read(src / "manifest.tsv").entries[3].path
    data = (src / victim).read_bytes()
    (src / victim).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other content
    with pytest.raises(RunError, match=f"{victim} does not match its manifest entry"):
        stage(LocalStorage(LocalStorageConfig(root=str(src))), tmp_path / "b", describe="share", attempts=2)
    assert not (tmp_path / "b" / victim).exists()


def test_a_changed_manifest_restages_exactly_the_changed_files(dataset: ImageDataset, tmp_path: Path) -> None:
    src = _copy(dataset, tmp_path / "src")
    stage(LocalStorage(LocalStorageConfig(root=str(src))), tmp_path / "copy", describe="share")
    victim = Manifest.read(src / "manifest.tsv").entries[5].path
    data = (src / victim).read_bytes()
    (src / victim).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    build_manifest(src).write(src / "manifest.tsv")
    report = stage(LocalStorage(LocalStorageConfig(root=str(src))), tmp_path / "copy", describe="share")
    assert report.files_transferred == 1 and (tmp_path / "copy" / victim).read_bytes() == (src / victim).read_bytes()


def test_staging_refuses_a_disk_that_is_too_small(
    dataset: ImageDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(ConfigError) as info:
        stage(LocalStorage(LocalStorageConfig(root=str(dataset.root))), tmp_path / "copy", describe="share")
    assert "only 0.0 MB free" in str(info.value) and "storage.scratch" in str(info.value)
    assert not any(p.is_file() for p in (tmp_path / "copy").rglob("*.JPEG"))


def test_a_source_without_manifest_cannot_be_staged(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(ConfigError, match="ddlkit data manifest"):
        stage(LocalStorage(LocalStorageConfig(root=str(tmp_path / "src"))), tmp_path / "copy", describe="src")


# ---------------------------------------------------------------------------- results
def _job_dir(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    (job / "checkpoints" / "step-00000004.ckpt").mkdir(parents=True)
    (job / "checkpoints" / "step-00000004.ckpt" / "weights.bin").write_bytes(b"w" * 100)
    (job / "checkpoints" / "latest").write_text("step-00000004.ckpt\n")
    for name in ("config.yaml", "metrics.jsonl", "model.pt", "rank-0.log", "staging-node0.json"):
        (job / name).write_text(name)
    (job / "result.json").write_text("{}")
    return job


def test_results_are_published_with_result_json_last(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    files = result_files(job, checkpoints=True)
    assert files[-1] == "result.json"
    assert {
        "model.pt",
        "rank-0.log",
        "metrics.jsonl",
        "checkpoints/latest",
        "checkpoints/step-00000004.ckpt/weights.bin",
    } <= set(files)
    dest = Flaky(tmp_path / "dest", transient=2)
    publish_files(job, files, dest, "results/job")
    assert dest.puts[-1] == "results/job/result.json"
    assert (tmp_path / "dest/results/job/checkpoints/step-00000004.ckpt/weights.bin").read_bytes() == b"w" * 100


def test_a_failed_upload_never_leaves_a_result_json_behind(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    storage = LocalSsdStorage(LocalSsdConfig(scratch=str(tmp_path / "s"), results=str(tmp_path / "dest"), attempts=3))
    flaky = Flaky(tmp_path / "dest", fail_keys=("model.pt",))
    storage.results_target = lambda name: (flaky, name)  # type: ignore[method-assign]
    with pytest.raises(RunError) as info:
        storage.publish_results(job, "job")
    assert "model.pt failed after 3 attempts" in str(info.value) and f"intact in {job}" in str(info.value)
    assert not (tmp_path / "dest" / "job" / "result.json").exists()
    assert (job / "result.json").is_file()


def test_nfs_results_go_to_the_share_unless_the_job_is_on_it(tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    storage = NfsStorage(NfsStorageConfig(root=str(share)))
    job = _job_dir(tmp_path)
    assert storage.publish_results(job, "job") == str(share / "results" / "job")
    assert (share / "results/job/result.json").is_file() and (share / "results/job/model.pt").is_file()
    on_share = _job_dir(share / "jobs")
    assert storage.publish_results(on_share, "job2") == str(on_share)
    assert not (share / "results" / "job2").exists()


def test_nfs_reads_data_in_place_and_explains_a_missing_mount(tmp_path: Path, dataset: ImageDataset) -> None:
    storage = NfsStorage(NfsStorageConfig(root=str(dataset.root.parent)))
    assert storage.data_path(str(dataset.root)) == dataset.root
    with pytest.raises(ConfigError, match="storage=local_ssd"):
        storage.data_path("blob://c/imagenet")
    with pytest.raises(ConfigError, match="is the NFS share mounted"):
        NfsStorage(NfsStorageConfig(root=str(tmp_path / "not-mounted"))).data_path(str(dataset.root))


# ---------------------------------------------------------------------------- whole runs (fake framework)
def _run(run_inprocess: Any, dataset: ImageDataset, tmp_path: Path, name: str, *more: str) -> Any:
    out = run_inprocess(
        "data=imagefolder",
        f"data.root={dataset.root}",
        "data.image_size=16",
        "trainer.batch_size=4",
        "trainer.epochs=2",
        "trainer.log_every=1",
        *more,
        job_dir=tmp_path / name,
    )
    assert (out.exit_code, out.status) == (0, "completed")
    return out


def test_local_ssd_run_stages_once_per_node_and_publishes(
    run_inprocess: Any, dataset: ImageDataset, tmp_path: Path
) -> None:
    scratch, results = tmp_path / "scratch", tmp_path / "results"
    args = (
        "storage=local_ssd",
        f"storage.scratch={scratch}",
        f"storage.results={results}",
        "storage.upload_checkpoints=true",
    )
    first = _run(run_inprocess, dataset, tmp_path, "first", *args)
    staged = json.loads((first.job_dir / "staging-node0.json").read_text())
    assert staged["files_transferred"] == len(Manifest.read(dataset.root / "manifest.tsv")) and not staged["reused"]
    assert staged["destination"] == str(scratch / "datasets" / dataset_dirname(str(dataset.root)))
    assert first.result["steps"] == 2 * (18 // 4)  # 3 classes x 6 training images, batches of 4
    # staging is timed apart from training, in result.json
    assert 0 < first.result["staging_time_s"] < first.result["wall_time_s"]
    published = results / job_name(first.job_dir)
    assert json.loads((published / "result.json").read_text()) == first.result
    assert (published / "staging-node0.json").is_file() and (published / "checkpoints" / "latest").is_file()
    # upload_checkpoints: the first epoch's checkpoint was copied when it was written, not only the last one
    assert (published / "checkpoints" / "step-00000004.ckpt").exists()
    second = _run(run_inprocess, dataset, tmp_path, "second", *args)
    again = json.loads((second.job_dir / "staging-node0.json").read_text())
    assert (again["bytes_transferred"], again["reused"]) == (0, True)


def test_local_ssd_defaults_to_the_scratch_directory_the_compute_target_provides(
    dataset: ImageDataset, tmp_path: Path
) -> None:
    barriers = []
    dist = SimpleNamespace(
        is_local_main=True, node=3, node_scratch=str(tmp_path / "node3"), barrier=lambda: barriers.append(1)
    )
    storage = LocalSsdStorage(LocalSsdConfig())
    run = SimpleNamespace(dist=dist, job_dir=tmp_path / "job", extra_result={})
    path = storage.prepare_data(str(dataset.root), run)
    assert run.extra_result["staging_time_s"] > 0
    assert path == tmp_path / "node3" / "datasets" / dataset_dirname(str(dataset.root))
    assert is_staged(path) and barriers == [1]
    assert json.loads((tmp_path / "job" / "staging-node3.json").read_text())["destination"] == str(path)
    with pytest.raises(ConfigError, match="storage.scratch"):
        LocalSsdStorage(LocalSsdConfig()).staged_path(str(dataset.root))


def test_nfs_run_reads_in_place(run_inprocess: Any, dataset: ImageDataset, tmp_path: Path) -> None:
    out = _run(run_inprocess, dataset, tmp_path, "nfs", "storage=nfs", f"storage.root={dataset.root.parent}")
    assert not (out.job_dir / "staging-node0.json").exists()
    assert (dataset.root.parent / "results" / job_name(out.job_dir) / "result.json").is_file()
