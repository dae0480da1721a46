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


class Server:
    """A real ``mlflow server`` (SQLite store, artifacts it serves itself) in ``root``."""

    def __init__(self, root: Path) -> None:
        port = free_port()
        mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
        if mlflow is None:
            pytest.fail("the tests need the mlflow package's server: pip install mlflow")
        self.log = open(root / "server.log", "wb")  # noqa: SIM115 -- open for the server's life
        self.proc = subprocess.Popen(
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
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=True,  # its workers go with it
            env={**os.environ, "MLFLOW_TRACKING_URI": ""},
        )
        self.uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(
                    f"mlflow server did not start:\n{(root / 'server.log').read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's MLflow server: its URI."""
    server = Server(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture
def own_mlflow_server(tmp_path: Path) -> Iterator[Server]:
    """A server of the test's own, which it may stop."""
    (tmp_path / "own-server").mkdir()
    server = Server(tmp_path / "own-server")
    try:
        yield server
    finally:
        server.stop()
