"""``compute=local``: run the job's single rank as a child process of the launcher.

The child gets its own process group, so cancelling reaches everything it started, and an
``atexit`` guard kills any group still alive when the launcher exits: ddlkit leaves no orphans.
"""

from __future__ import annotations

import atexit
import codecs
import os
import queue
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..hookspecs import hookimpl
from ..interfaces import ComputeTarget, JobHandle, JobSpec, JobState, JobStatus
from ..registry import Registration

_LIVE: set[subprocess.Popen] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass
class LocalComputeConfig:
    # seconds a cancelled job gets to checkpoint at its next step before it is killed
    grace_period_s: float = 30.0


class ProcessHandle(JobHandle):
    """A job made of one child process whose output goes to ``log_path`` and to :meth:`logs`."""

    def __init__(self, proc: subprocess.Popen, log_path: Path, grace_period_s: float, job_id: str) -> None:
        self.proc, self.log_path, self.grace = proc, log_path, grace_period_s
        self.id = job_id
        self._chunks: queue.Queue[str | None] = queue.Queue()
        self._tail: deque[str] = deque(maxlen=200)
        self._cancelled = False
        _LIVE.add(proc)
        self._reader = threading.Thread(target=self._pump, name=f"ddlkit-log-{job_id}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with open(self.log_path, "a", encoding="utf-8") as log:
            while data := os.read(fd, 65536):
                text = decoder.decode(data)
                log.write(text)
                log.flush()
                self._tail.append(text)
                self._chunks.put(text)
        self._chunks.put(None)

    def logs(self, follow: bool = True) -> Iterator[str]:
        while True:
            try:
                chunk = self._chunks.get(block=follow)
            except queue.Empty:
                return
            if chunk is None:
                return
            yield chunk

    def status(self) -> JobStatus:
        code = self.proc.poll()
        if code is None:
            return JobStatus(JobState.RUNNING)
        return self._final(code)

    def _final(self, code: int) -> JobStatus:
        _LIVE.discard(self.proc)
        if code == 0:
            return JobStatus(JobState.SUCCEEDED, 0)
        tail = "".join(self._tail).splitlines()[-15:]
        message = f"rank 0 ended with {describe_exit(code)}; last lines of {self.log_path}:\n" + "\n".join(
            "    " + ln for ln in tail)
        state = JobState.CANCELLED if self._cancelled else JobState.FAILED
        return JobStatus(state, code, message)

    def cancel(self) -> None:
        if self.proc.poll() is not None or self._cancelled:
            return
        self._cancelled = True
        _signal_group(self.proc, signal.SIGTERM)
        timer = threading.Timer(self.grace, lambda: _signal_group(self.proc, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def wait(self, timeout: float | None = None) -> JobStatus:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return JobStatus(JobState.RUNNING)
        self._reader.join(timeout=5)
        return self._final(code)


def start_process(spec: JobSpec, log_name: str, grace_period_s: float) -> ProcessHandle:
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(spec.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    return ProcessHandle(proc, spec.job_dir / log_name, grace_period_s, f"{spec.name}:{proc.pid}")


class LocalTarget(ComputeTarget):
    def submit(self, spec: JobSpec) -> JobHandle:
        return start_process(spec, "rank-0.log", self.cfg.grace_period_s)


@hookimpl
def ddlkit_compute_targets():
    yield Registration("local", LocalTarget, config=LocalComputeConfig,
                       description="one rank, a child process on this machine")
