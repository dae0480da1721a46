"""Multi-rank jobs for tests: real ``ddlkit`` launchers, real ``mpirun``, real worker processes
on this machine (``compute=local_mpi``, from the ddlkit-mpi plugin), with
:mod:`ddlkit.testing.dist_probe` loaded into every rank (``data=twin``, each rank's final
weights in ``weights-rank-N.npz``), and helpers to find, signal and wait for the job's processes.
What a framework plugin needs to show that N ranks step like one rank with N times the batch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from . import FAKES_MODULE, RunFactory, RunOutcome

#: the plugin module every rank of these jobs loads
PROBE_MODULE = "ddlkit.testing.dist_probe"

#: for the tests that start mpirun
needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (apt-get install openmpi-bin)"
)


def probe_env(*plugins: str, path: Sequence[Path] = ()) -> dict[str, str]:
    """Environment that loads the fakes, :mod:`ddlkit.testing.dist_probe` and ``plugins`` (more
    plugin modules, importable from ``path`` or installed) into launcher and ranks."""
    pythonpath = os.pathsep.join(p for p in (*map(str, path), os.environ.get("PYTHONPATH", "")) if p)
    return {"DDLKIT_PLUGINS": ",".join([FAKES_MODULE, PROBE_MODULE, *plugins]), "PYTHONPATH": pythonpath}


class DistJobs:
    """Runs ddlkit jobs the way a user does, and looks at their ranks. ``path``: directories
    the plugin modules that :meth:`start` adds are imported from."""

    def __init__(self, base: Path, *, path: Sequence[Path] = ()) -> None:
        self.base = base
        self.path = tuple(path)
        self.factory = RunFactory(base)

    def run(self, *overrides: str, job_dir: Path, timeout: float = 240.0) -> RunOutcome:
        return self.factory(*overrides, job_dir=job_dir, env=probe_env(path=self.path), timeout=timeout)

    def start(
        self, *overrides: str, job_dir: Path, env: Mapping[str, str] | None = None, plugins: tuple[str, ...] = ()
    ) -> subprocess.Popen:
        """A launcher in the background (for tests that signal or kill parts of the job), with
        ``env`` and the plugin modules ``plugins`` added."""
        argv = [sys.executable, "-m", "ddlkit", *overrides, f"hydra.run.dir={job_dir}"]
        return subprocess.Popen(
            argv,
            cwd=self.base,
            env={**os.environ, **(env or {}), **probe_env(*plugins, path=self.path)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def worker_pids(job_dir: Path) -> dict[int, int]:
    """{rank: pid} of the worker processes running ``job_dir``'s job."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            # python -m ddlkit.rank.worker job.json, in the job directory (mpirun's and the rank minders'
            # command lines end with it too, but only the worker's starts with it)
            if cmdline[1:4] != [b"-m", b"ddlkit.rank.worker", b"job.json"]:
                continue
            if Path(os.readlink(Path(entry.path, "cwd"))) != job_dir.resolve():
                continue
            environ = dict(
                line.split(b"=", 1) for line in Path(entry.path, "environ").read_bytes().split(b"\0") if b"=" in line
            )
        except OSError:
            continue
        # OpenMPI's rank (local_mpi, mpi), or the one a target's rank minder sets (slurm: RANK)
        found[int(environ.get(b"OMPI_COMM_WORLD_RANK") or environ[b"RANK"])] = int(entry.name)
    return found


def job_processes(job_dir: Path) -> list[int]:
    """Processes of the job: those that run in ``job_dir`` (minder, mpirun, rank minders, workers)
    or whose command line names it (the launcher)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                stat = Path(entry.path, "stat").read_text()
                mine = (
                    str(job_dir).encode() in Path(entry.path, "cmdline").read_bytes()
                    or Path(os.readlink(Path(entry.path, "cwd"))) == job_dir.resolve()
                )
                if mine and stat.rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def read_lines_until(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    """The launcher's output up to the first line containing ``needle``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return "".join(seen)
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no line with {needle!r} in the launcher's output:\n{''.join(seen)}")


class Lines:
    """A launcher's output lines as they come, each with when it came (``time.monotonic()``): for
    tests and benchmarks that act on a running job and time what it says."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        assert proc.stdout is not None
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream: Iterable[str]) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line))

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        """When the first line matching ``pattern`` came, and its match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, line in list(self.lines):
                if found := re.search(pattern, line):
                    return when, found
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.text}")

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)


def load_weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


#: a 2-rank PyTorch job for the compute targets' observability tests (issue 42): ResNet-18 at 16 px, 6
#: steps logged every 2 (metrics.jsonl and MLflow), steps 3-4 profiled
OBSERVED_JOB = (
    "framework=pytorch",
    "model=resnet18",
    "data.image_size=16",
    "data.num_classes=4",
    "data.length=128",
    "trainer.batch_size=4",
    "trainer.max_steps=6",
    "trainer.validate=false",
    "trainer.save_model=false",
    "framework.num_threads=1",
    "trainer.log_every=2",
    "trainer.profile.start_step=3",
    "trainer.profile.num_steps=2",
    "logger=[console,jsonl,mlflow]",
    "dist=native",
)
#: the steps :data:`OBSERVED_JOB` logs
OBSERVED_STEPS = [2, 4, 6]


def assert_every_rank_seen(job_dir: Path, ranks: Sequence[int] = (0, 1)) -> dict[str, Any]:
    """What a job of :data:`OBSERVED_JOB` leaves in ``job_dir`` of each rank: its profiler trace of
    steps 3 and 4, and its fields (images_per_sec, data_wait, sync_wait) in every train line of
    metrics.jsonl; returns telemetry.json, checked to be at the last step with every rank."""
    import json

    traces = sorted((job_dir / "profile/plugins/profile/steps_3-4").glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == [f"rank{r}" for r in ranks], sorted(job_dir.rglob("*"))
    for trace in traces:
        events = json.loads(trace.read_text())["traceEvents"]
        profiled = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
        assert profiled == {"ProfilerStep#3", "ProfilerStep#4"}, (trace, profiled)
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if m["split"] == "train"]
    assert [m["step"] for m in train] == OBSERVED_STEPS, train
    fields = ("images_per_sec", "data_wait", "sync_wait")
    assert all(f"rank{r}/{f}" in m for m in train for r in ranks for f in fields), train
    telemetry: dict[str, Any] = json.loads((job_dir / "telemetry.json").read_text())
    assert telemetry["step"] == OBSERVED_STEPS[-1], telemetry
    assert [r["rank"] for r in telemetry["ranks"]] == list(ranks), telemetry
    return telemetry
