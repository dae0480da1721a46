"""storage=azure and blob:// URLs against a real Azurite on 127.0.0.1 (see ddlkit_azure.testing)."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from ddlkit import ConfigError, RunError, StorageBackend
from ddlkit.builtin import transfer
from ddlkit.builtin.manifest import Manifest, build_manifest
from ddlkit.builtin.transfer import TransientStorageError, open_storage
from ddlkit.cli import main
from ddlkit.engine import job_name
from ddlkit.testing import RunFactory, add_plugin
from ddlkit.testing.contracts import StorageBackendContract
from ddlkit.testing.images import ImageDataset, make_image_dataset
from ddlkit_azure import _client, plugin
from ddlkit_azure.storage import AzureBlobConfig, AzureBlobStorage
from ddlkit_azure.testing import Azurite


class TestAzureBlobStorage(StorageBackendContract):
    @pytest.fixture
    def backend(self, blob_env: Azurite) -> StorageBackend:
        return AzureBlobStorage(AzureBlobConfig(container=f"c{uuid.uuid4().hex[:16]}", prefix="some/prefix"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    ds = make_image_dataset(tmp_path_factory.mktemp("data") / "imagenet", classes=3, train_per_class=6,
                            val_per_class=2, odd_files=True)
    build_manifest(ds.root).write(ds.root / "manifest.tsv")
    return ds


@pytest.fixture
def uploaded(dataset: ImageDataset, blob_container: str) -> str:
    url = f"{blob_container}/imagenet"
    assert main(["data", "upload", str(dataset.root), url, "--workers", "4"]) == 0
    return url


def test_blob_urls_open_with_credentials_from_the_environment(blob_container: str, tmp_path: Path, azurite: Azurite,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_bytes(b"payload")
    store = open_storage(f"{blob_container}/a/b")
    assert isinstance(store, AzureBlobStorage)
    store.put(tmp_path / "f", "x.bin")
    assert open_storage(blob_container).list() == ["a/b/x.bin"]
    # a SAS token instead of the connection string; a read-only one cannot write, and says why
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_URL", azurite.account_url)
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", azurite.sas_token("rl"))
    reader = open_storage(f"{blob_container}/a/b")
    assert reader.list() == ["x.bin"]
    with pytest.raises(ConfigError) as info:
        reader.put(tmp_path / "f", "y.bin")
    assert "permission" in str(info.value) and "sig=" not in str(info.value)


def test_upload_is_parallel_resumable_and_skips_matching_blobs(dataset: ImageDataset, blob_container: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    manifest = Manifest.read(dataset.root / "manifest.tsv")
    uploaded = f"{blob_container}/imagenet"
    assert main(["data", "upload", str(dataset.root), uploaded, "--workers", "4"]) == 0
    assert f"uploaded {len(manifest)} files" in capsys.readouterr().out
    store = open_storage(uploaded)
    assert store.list() == sorted([e.path for e in manifest.entries] + ["manifest.tsv"])
    assert store.list_hashes()[manifest.entries[0].path] == (manifest.entries[0].size, manifest.entries[0].sha256)
    store.put(dataset.root / manifest.entries[0].path, manifest.entries[1].path)  # as if cut mid-file
    assert main(["data", "upload", str(dataset.root), uploaded]) == 0
    assert "uploaded 1 files" in capsys.readouterr().out
    assert store.list_hashes()[manifest.entries[1].path] == (manifest.entries[1].size, manifest.entries[1].sha256)
    assert main(["data", "upload", str(dataset.root), uploaded]) == 0
    assert "uploaded 0 files (0.0 MB)" in capsys.readouterr().out


def test_local_ssd_stages_from_blob_and_reuses_the_copy(uploaded: str, tmp_path: Path, dataset: ImageDataset) -> None:
    manifest = Manifest.read(dataset.root / "manifest.tsv")
    first = transfer.stage(open_storage(uploaded), tmp_path / "ssd", describe=uploaded)
    assert (first.files_transferred, first.bytes_transferred) == (len(manifest), manifest.total_bytes)
    assert build_manifest(tmp_path / "ssd").dumps() == manifest.dumps()
    second = transfer.stage(open_storage(uploaded), tmp_path / "ssd", describe=uploaded)
    assert (second.bytes_transferred, second.reused) == (0, True)


def test_results_survive_transient_errors_and_never_look_complete_when_cut(tmp_path: Path, blob_container: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer.time, "sleep", lambda s: None)
    job = tmp_path / "job"
    job.mkdir()
    for name in ("metrics.jsonl", "model.pt", "rank-0.log", "result.json"):
        (job / name).write_text(name * 100)
    storage = AzureBlobStorage(AzureBlobConfig(container=blob_container.removeprefix("blob://"), attempts=3))
    real_upload = _client.Container.upload
    calls = {"n": 0}

    def flaky_upload(self: Any, local_path: Path, key: str) -> None:
        calls["n"] += 1
        if calls["n"] % 2:  # every other request times out
            raise TransientStorageError("simulated timeout")
        real_upload(self, local_path, key)

    monkeypatch.setattr(_client.Container, "upload", flaky_upload)
    assert storage.publish_results(job, "job-1") == f"{blob_container}/results/job-1"
    assert sorted(storage.list("results/job-1/")) == [f"results/job-1/{n}" for n in
                                                      ("metrics.jsonl", "model.pt", "rank-0.log", "result.json")]

    def broken_upload(self: Any, local_path: Path, key: str) -> None:
        if key.endswith("model.pt"):
            raise TransientStorageError("simulated outage")
        real_upload(self, local_path, key)

    monkeypatch.setattr(_client.Container, "upload", broken_upload)
    with pytest.raises(RunError) as info:
        storage.publish_results(job, "job-2")
    assert f"ddlkit data upload {job} {blob_container}/results/job-2" in str(info.value)
    assert not storage.exists("results/job-2/result.json")


@pytest.mark.slow
def test_a_run_stages_from_blob_and_writes_results_back(run_inprocess: Any, ddlkit_pm: Any, uploaded: str,
                                                        tmp_path: Path, blob_env: Azurite, dataset: ImageDataset,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    add_plugin(ddlkit_pm, plugin, name="azure")
    container = uploaded.removeprefix("blob://").split("/")[0]
    out = run_inprocess("data=imagefolder", f"data.root={uploaded}", "data.image_size=16", "trainer.batch_size=4",
                        "storage=azure", f"storage.container={container}", f"storage.scratch={tmp_path / 'ssd'}",
                        "storage.upload_checkpoints=true", job_dir=tmp_path / "job")
    assert (out.exit_code, out.status) == (0, "completed")
    staging = json.loads((out.job_dir / "staging-node0.json").read_text())
    assert staging["files_transferred"] == len(Manifest.read(dataset.root / "manifest.tsv"))
    store = AzureBlobStorage(AzureBlobConfig(container=container))
    downloaded = tmp_path / "result.json"
    published = f"results/{job_name(out.job_dir)}"
    store.get(f"{published}/result.json", downloaded)
    assert json.loads(downloaded.read_text()) == out.result
    assert store.exists(f"{published}/checkpoints/latest") and store.exists(f"{published}/staging-node0.json")
    # the credential lived in the environment only: no copy of it on disk or in the blobs
    secret = blob_env.connection_string.split("AccountKey=")[1].split(";")[0]
    for path in out.job_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".yaml", ".jsonl", ".log"):
            assert secret not in path.read_text(errors="replace"), path


@pytest.mark.slow
def test_a_job_elsewhere_reaches_blob_storage_with_what_the_launcher_passes_on(
        run_factory: RunFactory, uploaded: str, tmp_path: Path, blob_env: Azurite) -> None:
    """compute=elsewhere runs the job in a bare environment on a copy of its directory: the
    storage account and its credential reach it only through the job spec (the credential in
    its secret environment), and land in no file on either side."""
    container = uploaded.removeprefix("blob://").split("/")[0]
    cluster = tmp_path / "cluster"
    out = run_factory("data=imagefolder", f"data.root={uploaded}", "data.image_size=16", "trainer.batch_size=4",
                      "trainer.epochs=1", "storage=azure", f"storage.container={container}",
                      f"storage.scratch={tmp_path / 'ssd'}", "compute=elsewhere", f"compute.root={cluster}",
                      timeout=180).assert_success()
    downloaded = tmp_path / "published.json"
    AzureBlobStorage(AzureBlobConfig(container=container)).get(f"results/{job_name(out.job_dir)}/result.json",
                                                               downloaded)
    assert json.loads(downloaded.read_text()) == out.result
    secret = blob_env.connection_string.split("AccountKey=")[1].split(";")[0]
    for path in [*out.job_dir.rglob("*"), *cluster.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_a_sas_in_the_account_url_is_used_and_never_written_or_printed(run_factory: RunFactory, azurite: Azurite,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17, item 10: the SAS in ``storage.account_url`` authenticates the results upload (no
    other credential is set) and is in no file, blob or line of output; item 8: the README's
    ``storage.sas_token=...`` is refused in one line that does not show the token."""
    for name in ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL",
                 "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    sas = azurite.sas_token()
    signature = sas.split("sig=")[1].split("&")[0]
    container = f"t{uuid.uuid4().hex[:20]}"
    out = run_factory("storage=azure", f"storage.account_url='{azurite.account_url}?{sas}'",
                      f"storage.container={container}", f"storage.scratch={tmp_path / 'ssd'}", "data.length=64",
                      "data.val_length=16", "trainer.epochs=1", "trainer.batch_size=8", timeout=180).assert_success()
    written = json.loads((out.job_dir / "job.json").read_text())
    assert written["config"]["storage"]["account_url"] == f"{azurite.account_url}?***"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    store = AzureBlobStorage(AzureBlobConfig(container=container))
    published = f"results/{job_name(out.job_dir)}"
    assert store.exists(f"{published}/result.json")
    for key in store.list(published):
        store.get(key, tmp_path / "blob")
        assert signature.encode() not in (tmp_path / "blob").read_bytes(), key
    assert signature not in out.stdout + out.stderr
    for path in run_factory.base_dir.rglob("*"):
        assert not path.is_file() or signature.encode() not in path.read_bytes(), path

    refused = run_factory("storage=azure", f"storage.sas_token='{sas}'", "data.length=64").assert_returncode(2)
    assert signature not in refused.stdout + refused.stderr
    assert refused.stderr.startswith("ddlkit: error: `storage.sas_token` is not an option of storage=azure")
    assert "sas_token_file" in refused.stderr and len(refused.stderr.splitlines()) == 1


#: remote addresses in /proc/net/{tcp,udp}[6] that are this machine: unspecified, 127.0.0.1, ::1, ::ffff:127.0.0.1
_LOOPBACK_HEX = {"00000000", "0100007F", "00000000000000000000000000000000", "00000000000000000000000001000000",
                 "0000000000000000FFFF00000100007F"}


def _remote_addresses(pid: int) -> list[str]:
    """The remote addresses (hex, as the kernel shows them) of every socket process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                found.append(fields[2].split(":")[0])
    return found


def test_azurite_talks_to_loopback_only(azurite: Azurite, uploaded: str) -> None:
    """Started with --disableTelemetry, the emulator holds no socket to any other host."""
    assert "--disableTelemetry" in azurite.process.args
    addresses = _remote_addresses(azurite.process.pid)
    assert addresses, "azurite holds no socket at all: the check would prove nothing"
    assert set(addresses) <= _LOOPBACK_HEX, addresses
