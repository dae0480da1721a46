"""The Azure plugin's test kit: stand-ins for the Azure services, for this plugin's tests, its
benchmarks and plugins built on it. Nothing in the product imports it.

* this module (a pytest plugin): a real Azurite (Microsoft's Blob Storage emulator) on a free
  loopback port;
* :mod:`.loopback`: HTTPS on 127.0.0.1 with a self-signed certificate, an intercepting proxy and a
  stand-in ``az`` CLI, for testing the real Azure SDKs against services Azurite does not emulate;
* :mod:`.azureml`: an Azure ML workspace on that server whose jobs really run on this machine;
* :mod:`.batchai`: a Batch AI service (API 2018-05-01) on that server, likewise.

Enable in a top-level ``conftest.py`` with ``pytest_plugins = ["ddlkit_azure.testing"]`` (or import
the fixtures). Azurite is the npm package ``azurite`` (``npm install -g azurite``); tests that use
these fixtures skip, saying so, when it is not installed.

* ``azurite`` (session): the running emulator: ``account_url``, ``connection_string``, ``sas_token()``;
* ``blob_env``: ``$AZURE_STORAGE_CONNECTION_STRING`` set for the test, so ``blob://`` URLs open;
* ``blob_container``: a fresh, uniquely named container for the test, as a ``blob://`` URL.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ddlkit.compute.ports import free_ports

#: Azurite's fixed development account; its key is public (documented by Microsoft), not a secret
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
START_TIMEOUT_S = 30.0


@dataclass
class Azurite:
    port: int
    location: Path
    process: subprocess.Popen

    @property
    def account_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.account_url};"
        )

    def sas_token(self, permissions: str = "racwdl", hours: float = 1.0) -> str:
        """An account SAS for the blob service (read, add, create, write, delete, list by default)."""
        from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

        return generate_account_sas(
            ACCOUNT,
            ACCOUNT_KEY,
            ResourceTypes(service=True, container=True, object=True),
            AccountSasPermissions.from_string(permissions),
            datetime.now(UTC) + timedelta(hours=hours),
        )


def azurite_command() -> str | None:
    """``azurite-blob`` on PATH or in a local ``node_modules``, else None."""
    found = shutil.which("azurite-blob")
    if found:
        return found
    local = Path.cwd() / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else None


def start_azurite(location: Path) -> Azurite:
    command = azurite_command()
    if command is None:
        raise FileNotFoundError("azurite-blob")
    location.mkdir(parents=True, exist_ok=True)
    port = free_ports(1)[0]  # chosen where no connection is handed it before Azurite listens
    log = open(location / "azurite.log", "wb")
    process = subprocess.Popen(
        # --disableTelemetry: Azurite otherwise reports to an outside host; tests talk to loopback only
        [
            command,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(location),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"azurite exited with {process.returncode}: {(location / 'azurite.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Azurite(port, location, process)
        except OSError:
            time.sleep(0.1)
    stop_azurite(process)
    raise RuntimeError(
        f"azurite did not listen on 127.0.0.1:{port} within {START_TIMEOUT_S}s: "
        f"{(location / 'azurite.log').read_text()}"
    )


def stop_azurite(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    if azurite_command() is None:
        pytest.skip("Azurite is not installed (npm install -g azurite); CI installs it, see .ci/run")
    server = start_azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        stop_azurite(server.process)


@pytest.fixture
def blob_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Azurite:
    for name in ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ACCOUNT_URL", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    return azurite


@pytest.fixture
def blob_container(blob_env: Azurite) -> str:
    """``blob://<unique container>`` (created on first write)."""
    return f"blob://t{uuid.uuid4().hex[:20]}"
