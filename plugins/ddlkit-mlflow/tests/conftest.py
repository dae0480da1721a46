"""The plugin's tests use ddlkit's test kit, as any plugin's would, and a real MLflow tracking server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["ddlkit.testing"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment restored, a working directory of its own, fresh plugin and Hydra state; no
    tracking URI from the environment (each test names its server)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` (SQLite store, artifacts it serves itself) for the session: its URI."""
    if shutil.which("mlflow") is None and not Path(sys.executable).with_name("mlflow").exists():
        pytest.fail("the tests need the mlflow package's server: pip install mlflow")
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    log = open(root / "server.log", "wb")  # noqa: SIM115 -- open for the server's life
    proc = subprocess.Popen(
        [
            mlflow,
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        start_new_session=True,  # its workers go with it
        env={**os.environ, "MLFLOW_TRACKING_URI": ""},
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            pytest.fail(f"mlflow server did not start:\n{(root / 'server.log').read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    try:
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
