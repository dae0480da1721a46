"""The plugin's tests use ddlkit's test kit, as any plugin's would, and a real MLflow tracking server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlkit_mlflow.testing import MlflowServer

pytest_plugins = ["ddlkit.testing"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment restored, a working directory of its own, fresh plugin and Hydra state; no
    tracking URI from the environment (each test names its server)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's MLflow server: its URI."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture
def own_mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    """A server of the test's own, which it may stop."""
    (tmp_path / "own-server").mkdir()
    server = MlflowServer(tmp_path / "own-server")
    try:
        yield server
    finally:
        server.stop()
