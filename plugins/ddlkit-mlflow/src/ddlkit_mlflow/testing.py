"""A real MLflow tracking server for tests and benchmarks: ``mlflow server`` with a SQLite store
and the artifacts it serves itself, on 127.0.0.1, in a directory of its own; and what a test reads
back from a tracking server (:func:`runs_of`, :func:`steps`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ddlkit.compute.ports import free_ports


class MlflowServer:
    """``mlflow server`` in ``root`` (its store, artifacts and log there), answering ``/health``
    once built; :meth:`stop` ends it and its workers."""

    def __init__(self, root: Path, *, start_timeout_s: float = 120.0) -> None:
        (port,) = free_ports(1)
        mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
        if mlflow is None:
            raise RuntimeError("an MLflow server needs the mlflow package's server: pip install mlflow")
        self.log_path = root / "server.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 -- open for the server's life
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
        deadline = time.monotonic() + start_timeout_s
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server did not start:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> MlflowServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def runs_of(uri: str, name: str) -> list[Any]:
    """The runs of experiment ``name`` on the tracking server at ``uri``."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    assert exp is not None, f"no experiment {name}"
    return list(client.search_runs([exp.experiment_id], max_results=1000))


def steps(uri: str, run_id: str, key: str = "train/loss") -> list[tuple[int, float]]:
    """Metric ``key`` of run ``run_id`` as (step, value), in the order it was logged."""
    from mlflow import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.timestamp, m.step))]
