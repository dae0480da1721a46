"""storage=azure and blob:// URLs against a real Azurite on 127.0.0.1 (see ddlkit_azure.testing)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddlkit import ConfigError, RunError, StorageBackend
from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.storage import Manifest, TransientStorageError, _retry, build_manifest, open_storage, stage
from ddlkit.testing import FAKES_MODULE, RunFactory, add_plugin, interruptible, wait_for
from ddlkit.testing.contracts import StorageBackendContract
from ddlkit.testing.core import job_name, main
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
    ds = make_image_dataset(
        tmp_path_factory.mktemp("data") / "imagenet", classes=3, train_per_class=6, val_per_class=2, odd_files=True
    )
    build_manifest(ds.root).write(ds.root / "manifest.tsv")
    return ds


@pytest.fixture
def uploaded(dataset: ImageDataset, blob_container: str) -> str:
    url = f"{blob_container}/imagenet"
    assert main(["data", "upload", str(dataset.root), url, "--workers", "4"]) == 0
    return url


def test_blob_urls_open_with_credentials_from_the_environment(
    blob_container: str, tmp_path: Path, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_a_blob_data_root_is_read_in_the_account_of_storage_account_url(
    run_factory: RunFactory, uploaded: str, azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The account given as storage.account_url (the SAS token in the environment) is the one a
    blob:// data.root is read from; the ranks said "set storage.account_url", which was set (issue 23, item 6)."""
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", azurite.sas_token())
    container = uploaded.removeprefix("blob://").split("/")[0]
    out = run_factory(
        "data=imagefolder",
        f"data.root={uploaded}",
        "data.image_size=16",
        "trainer.batch_size=4",
        "trainer.epochs=1",
        "storage=azure",
        f"storage.account_url={azurite.account_url}",
        f"storage.container={container}",
        f"storage.scratch={tmp_path / 'ssd'}",
    ).assert_success()
    assert out.result["status"] == "completed"


def test_no_storage_credential_is_one_line_naming_where_it_was_looked_for(
    run_factory: RunFactory, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An emulator's http endpoint and no SAS token nor connection string: the SDK's 'Token credential
    is only supported with HTTPS' traceback from every rank, exit 1, and a resume hint (issue 23, item 7)."""
    for name in ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL"):
        monkeypatch.delenv(name, raising=False)
    out = run_factory("storage=azure", f"storage.account_url={azurite.account_url}").assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: no Azure storage credential found: looked for $AZURE_STORAGE_SAS_TOKEN and "
        "$AZURE_STORAGE_CONNECTION_STRING in the environment and storage.sas_token_file, "
        "storage.connection_string_file in the config, and a sign-in (DefaultAzureCredential) cannot be used over "
        f"plain http ({azurite.account_url}): export AZURE_STORAGE_SAS_TOKEN=<a SAS token> or "
        "AZURE_STORAGE_CONNECTION_STRING=<a connection string>.\n"
    ), out.output
    assert out.stdout == "" and not out.job_dir.exists()


def test_upload_is_parallel_resumable_and_skips_matching_blobs(
    dataset: ImageDataset, blob_container: str, capsys: pytest.CaptureFixture[str]
) -> None:
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
    first = stage(open_storage(uploaded), tmp_path / "ssd", describe=uploaded)
    assert (first.files_transferred, first.bytes_transferred) == (len(manifest), manifest.total_bytes)
    assert build_manifest(tmp_path / "ssd").dumps() == manifest.dumps()
    second = stage(open_storage(uploaded), tmp_path / "ssd", describe=uploaded)
    assert (second.bytes_transferred, second.reused) == (0, True)


def test_results_survive_transient_errors_and_never_look_complete_when_cut(
    tmp_path: Path, blob_container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)
    job = tmp_path / "job"
    job.mkdir()
    for name in ("metrics.jsonl", "model.pt", "rank-0.log", "result.json"):
        (job / name).write_text(name * 100)
    storage = AzureBlobStorage(AzureBlobConfig(container=blob_container.removeprefix("blob://"), attempts=3))
    real_upload = _client.Container.upload
    attempts: dict[str, int] = {}

    def flaky_upload(self: Any, local_path: Path, key: str) -> None:
        # every file's first request times out (counted per file: the files are uploaded in parallel)
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] == 1:
            raise TransientStorageError("simulated timeout")
        real_upload(self, local_path, key)

    monkeypatch.setattr(_client.Container, "upload", flaky_upload)
    assert storage.publish_results(job, "job-1") == f"{blob_container}/results/job-1"
    assert sorted(attempts.values()) == [2, 2, 2, 2]
    assert sorted(storage.list("results/job-1/")) == [
        f"results/job-1/{n}" for n in ("metrics.jsonl", "model.pt", "rank-0.log", "result.json")
    ]

    def broken_upload(self: Any, local_path: Path, key: str) -> None:
        if key.endswith("model.pt"):
            raise TransientStorageError("simulated outage")
        real_upload(self, local_path, key)

    monkeypatch.setattr(_client.Container, "upload", broken_upload)
    with pytest.raises(RunError) as info:
        storage.publish_results(job, "job-2")
    assert f"ddlkit data upload {job} {blob_container}/results/job-2" in str(info.value)
    assert not storage.exists("results/job-2/result.json")


class SilentEndpoint:
    """A blob endpoint that accepts connections and never answers (a hung storage account)."""

    def __init__(self, url: str, connections: list[socket.socket]) -> None:
        self.url, self.connections = url, connections


@pytest.fixture
def silent_endpoint() -> Iterator[SilentEndpoint]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield SilentEndpoint(f"http://127.0.0.1:{server.getsockname()[1]}/devstoreaccount1", accepted)
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("endpoint", ["down", "silent"])
def test_an_endpoint_that_is_down_or_silent_fails_fast_announcing_each_retry(
    endpoint: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    azurite: Azurite,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the SDK's own silent retries the results upload kept quiet for over 10 minutes; now
    every attempt is bounded, each retry is a line on stderr with its delay, and the end is the
    error with the `ddlkit data upload` hint."""
    if endpoint == "down":
        url = f"http://127.0.0.1:{_unused_port()}/devstoreaccount1"
    else:
        url = request.getfixturevalue("silent_endpoint").url
        monkeypatch.setattr(_client, "READ_TIMEOUT_S", 1)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string.replace(azurite.account_url, url))
    job = tmp_path / "job"
    job.mkdir()
    (job / "result.json").write_text("{}")
    storage = AzureBlobStorage(AzureBlobConfig(container="results", attempts=3))
    started = time.monotonic()
    with pytest.raises(RunError) as info:
        storage.publish_results(job, "job-1")
    elapsed = time.monotonic() - started
    assert "failed after 3 attempts" in str(info.value) and f"ddlkit data upload {job}" in str(info.value)
    retries = [line for line in capsys.readouterr().err.splitlines() if "retrying in" in line]
    assert [line.split("retrying in ")[1] for line in retries] == ["0.5 s (attempt 2 of 3)", "1 s (attempt 3 of 3)"]
    # three bounded attempts and 1.5 s of back-off: seconds, not minutes (the SDK alone used to retry 3 times more)
    assert elapsed < (6 if endpoint == "down" else 3 * 1 + 1.5 + 5), elapsed


def test_a_silent_endpoint_is_reported_within_seconds_of_the_first_contact(
    silent_endpoint: SilentEndpoint,
    azurite: Azurite,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The write check, a run's first contact with its storage, waited a whole read timeout (30 s)
    in silence before its first line (issue 23, minor)."""
    monkeypatch.setattr(_retry, "WAIT_NOTICE_S", 0.5)
    monkeypatch.setattr(_client, "READ_TIMEOUT_S", 2)
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string.replace(azurite.account_url, silent_endpoint.url)
    )
    storage = AzureBlobStorage(AzureBlobConfig(container="results", attempts=1))
    with pytest.raises(RunError):
        storage.check_access("job-1")
    assert capsys.readouterr().err.splitlines()[0] == (
        "ddlkit: checking that blob://results/results/job-1 is writable: no answer for 0.5 s; still waiting "
        "(attempt 1 of 1)"
    )


@pytest.mark.slow
def test_a_run_stages_from_blob_and_writes_results_back(
    run_inprocess: Any,
    ddlkit_pm: Any,
    uploaded: str,
    tmp_path: Path,
    blob_env: Azurite,
    dataset: ImageDataset,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    add_plugin(ddlkit_pm, plugin, name="azure")
    container = uploaded.removeprefix("blob://").split("/")[0]
    out = run_inprocess(
        "data=imagefolder",
        f"data.root={uploaded}",
        "data.image_size=16",
        "trainer.batch_size=4",
        "storage=azure",
        f"storage.container={container}",
        f"storage.scratch={tmp_path / 'ssd'}",
        "storage.upload_checkpoints=true",
        job_dir=tmp_path / "job",
    )
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
    run_factory: RunFactory, uploaded: str, tmp_path: Path, blob_env: Azurite
) -> None:
    """compute=elsewhere runs the job in a bare environment on a copy of its directory: the
    storage account and its credential reach it only through the job spec (the credential in
    its secret environment), and land in no file on either side."""
    container = uploaded.removeprefix("blob://").split("/")[0]
    cluster = tmp_path / "cluster"
    out = run_factory(
        "data=imagefolder",
        f"data.root={uploaded}",
        "data.image_size=16",
        "trainer.batch_size=4",
        "trainer.epochs=1",
        "storage=azure",
        f"storage.container={container}",
        f"storage.scratch={tmp_path / 'ssd'}",
        "compute=elsewhere",
        f"compute.root={cluster}",
        timeout=180,
    ).assert_success()
    downloaded = tmp_path / "published.json"
    AzureBlobStorage(AzureBlobConfig(container=container)).get(
        f"results/{job_name(out.job_dir)}/result.json", downloaded
    )
    assert json.loads(downloaded.read_text()) == out.result
    secret = blob_env.connection_string.split("AccountKey=")[1].split(";")[0]
    for path in [*out.job_dir.rglob("*"), *cluster.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_a_sas_in_the_account_url_is_used_and_never_written_or_printed(
    run_factory: RunFactory, azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17, item 10: the SAS in ``storage.account_url`` authenticates the results upload (no
    other credential is set) and is in no file, blob or line of output; item 8: the README's
    ``storage.sas_token=...`` is refused in one line that does not show the token."""
    for name in (
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_URL",
        "AZURE_STORAGE_ACCOUNT",
    ):
        monkeypatch.delenv(name, raising=False)
    sas = azurite.sas_token()
    signature = sas.split("sig=")[1].split("&")[0]
    container = f"t{uuid.uuid4().hex[:20]}"
    out = run_factory(
        "storage=azure",
        f"storage.account_url='{azurite.account_url}?{sas}'",
        f"storage.container={container}",
        f"storage.scratch={tmp_path / 'ssd'}",
        "data.length=64",
        "data.val_length=16",
        "trainer.epochs=1",
        "trainer.batch_size=8",
        timeout=180,
    ).assert_success()
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


@pytest.mark.slow
def test_a_credential_that_cannot_write_results_is_refused_before_training(
    run_factory: RunFactory, azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17, item 13: a read-only SAS used to be found out only when the results were
    uploaded, after training. Rank 0 now writes a probe blob where the results go before the
    dataset is staged, names the credential it used, and stops with exit 2 if it may not write."""
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_URL", azurite.account_url)
    container = f"t{uuid.uuid4().hex[:20]}"
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", azurite.sas_token("racwdl"))
    args = (
        "storage=azure",
        f"storage.container={container}",
        f"storage.scratch={tmp_path / 'ssd'}",
        "data.length=64",
        "data.val_length=16",
        "trainer.epochs=1",
        "trainer.batch_size=8",
    )
    ok = run_factory(*args, timeout=180).assert_success()
    where = f"blob://{container}/results/{job_name(ok.job_dir)}"
    assert f"ddlkit: storage=azure: {where} is writable with the SAS token" in ok.stdout
    assert not AzureBlobStorage(AzureBlobConfig(container=container)).exists(
        f"results/{job_name(ok.job_dir)}/.ddlkit-write-check"
    )  # the probe is gone

    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", azurite.sas_token("rl"))
    refused = run_factory(*args, timeout=180).assert_returncode(2)
    assert "access denied to the SAS token" in refused.stderr and "write" in refused.stderr
    assert not list((refused.job_dir / "checkpoints").glob("*.ckpt"))
    assert not (refused.job_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_sigterm_while_staging_from_a_silent_endpoint_stops_the_job_at_once(
    silent_endpoint: SilentEndpoint, azurite: Azurite, tmp_path: Path
) -> None:
    """Issue 17, item 3: a SIGTERM (a scheduler's cancel) during a stalled download used to wait
    for the kill after the grace period (30 s here); there is nothing to checkpoint yet, so the
    worker stops at once and the launcher reports a resumable stop."""
    job_dir = tmp_path / "job"
    env = {
        **os.environ,
        "DDLKIT_PLUGINS": FAKES_MODULE,
        "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(azurite.account_url, silent_endpoint.url),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            "storage=azure",
            "data=imagefolder",
            "data.root=blob://data/imagenet",
            f"storage.scratch={tmp_path / 'ssd'}",
            f"hydra.run.dir={job_dir}",
        ],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )
    try:
        wait_for(
            lambda: silent_endpoint.connections,
            "the worker to be inside its first (never answered) request",
            timeout=90,
            pace=0.2,
            process=proc,
        )
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        waited = time.monotonic() - stopped
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, stdout + stderr
    assert "stopped by SIGTERM before training started; nothing to checkpoint yet" in stdout
    assert waited < 15, waited  # not the 30 s grace period, not the 5 x 30 s of a stalled staging


#: remote addresses in /proc/net/{tcp,udp}[6] that are this machine: unspecified, 127.0.0.1, ::1, ::ffff:127.0.0.1
_LOOPBACK_HEX = {
    "00000000",
    "0100007F",
    "00000000000000000000000000000000",
    "00000000000000000000000001000000",
    "0000000000000000FFFF00000100007F",
}


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
