"""Multi-rank jobs for the distributed tests: real ``ddlkit`` launchers, real ``mpirun``, real
worker processes on this machine (compute=local_mpi), with ``dist_probe`` loaded in every rank."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ddlkit.testing import FAKES_MODULE, RunFactory, RunOutcome

HERE = Path(__file__).parent

def probe_env(*plugins: str) -> dict[str, str]:
    """Environment that loads the fakes, tests/dist/dist_probe.py and ``plugins`` (more modules
    of tests/dist) into launcher and ranks."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {"DDLKIT_PLUGINS": ",".join([FAKES_MODULE, "dist_probe", *plugins]), "PYTHONPATH": path}


class DistJobs:
    """Runs ddlkit jobs the way a user does, and looks at their ranks."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.factory = RunFactory(base)

    def run(self, *overrides: str, job_dir: Path, timeout: float = 240.0) -> RunOutcome:
        return self.factory(*overrides, job_dir=job_dir, env=probe_env(), timeout=timeout)

    def start(self, *overrides: str, job_dir: Path, env: Mapping[str, str] | None = None,
              plugins: tuple[str, ...] = ()) -> subprocess.Popen:
        """A launcher in the background (for tests that signal or kill parts of the job), with
        ``env`` and the plugin modules ``plugins`` of tests/dist added."""
        argv = [sys.executable, "-m", "ddlkit", *overrides, f"hydra.run.dir={job_dir}"]
        return subprocess.Popen(argv, cwd=self.base, env={**os.environ, **(env or {}), **probe_env(*plugins)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def worker_pids(job_dir: Path) -> dict[int, int]:
    """{rank: pid} of the worker processes running ``job_dir``'s job."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            # python -m ddlkit.worker job.json, in the job directory (mpirun's and the rank minders'
            # command lines end with it too, but only the worker's starts with it)
            if cmdline[1:4] != [b"-m", b"ddlkit.worker", b"job.json"]:
                continue
            if Path(os.readlink(Path(entry.path, "cwd"))) != job_dir.resolve():
                continue
            environ = dict(line.split(b"=", 1) for line in Path(entry.path, "environ").read_bytes().split(b"\0")
                           if b"=" in line)
        except OSError:
            continue
        found[int(environ[b"OMPI_COMM_WORLD_RANK"])] = int(entry.name)
    return found


def job_processes(job_dir: Path) -> list[int]:
    """Processes of the job: those that run in ``job_dir`` (minder, mpirun, rank minders, workers)
    or whose command line names it (the launcher)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                stat = Path(entry.path, "stat").read_text()
                mine = (str(job_dir).encode() in Path(entry.path, "cmdline").read_bytes()
                        or Path(os.readlink(Path(entry.path, "cwd"))) == job_dir.resolve())
                if mine and stat.rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


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


def load_weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests here start mpirun: skip them where there is none."""
    if shutil.which("mpirun") is None:
        skip = pytest.mark.skip(reason="OpenMPI's mpirun is not installed (apt-get install openmpi-bin)")
        for item in items:
            if HERE in Path(item.fspath).parents and item.get_closest_marker("slow"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def dt() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import this conftest by name)."""
    return SimpleNamespace(DistJobs=DistJobs, worker_pids=worker_pids, job_processes=job_processes,
                           wait_until=wait_until, read_lines_until=read_lines_until, load_weights=load_weights)
