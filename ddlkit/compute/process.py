"""Jobs whose processes run on this machine: :class:`ProcessJob`, for targets such as
``compute=local`` (the worker) and ``compute=local_mpi`` / ``compute=mpi`` (``mpirun``).

The command runs under a small minder (:mod:`ddlkit.compute._minder`) in a session of its own,
with the job directory as its working directory. The command writes its output to a log file
in the job directory and the minder writes its exit code next to it, so any process -- the
launcher that started it, ``ddlkit jobs`` in another shell, a re-run sweep -- can follow, judge
and cancel the job from its id (the minder's pid) and its directory. While the launcher that
started a job has not detached it, the job does not outlive the launcher: an exit guard kills the
job's whole session when the launcher exits, and should the launcher die without running it
(SIGKILL), the minder notices and stops the job as a cancel does (it checkpoints first). Should
the minder itself be killed (``kill -9`` of the job's id), its guard kills the whole session and
records the end: a job's processes never train on unseen, and until they are gone the job's
session keeps it running for :meth:`ProcessJob.status`.
"""

from __future__ import annotations

import atexit
import codecs
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from ..atomic import write_text
from ..interfaces import JobHandle, JobState, JobStatus
from ..jobdir import CANCEL_FILE, DETACHED_FILE, EXIT_FILE, EXIT_OOM_KILLED, STATE_DIR
from .rank_minder import oom_kill_counter

_MINDER = str(Path(__file__).with_name("_minder.py"))
#: seconds between looks at a log file that is being followed
_FOLLOW_PACE_S = 0.05

#: minder pids of jobs started by this process and not detached: killed (whole session) at exit
_OWNED: set[int] = set()


@atexit.register
def _kill_owned() -> None:
    for pid in list(_OWNED):
        kill_session(pid, signal.SIGKILL)


def processes() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every process, from /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        yield int(entry.name), int(fields[1]), int(fields[3])


def kill_session(sid: int, sig: int, *, spare: int | None = None) -> None:
    """Signal every process of session ``sid`` (but ``spare``). Launchers such as mpirun put each
    rank in a process group of its own, so a group kill would miss them; all stay in the session."""
    for pid, _, session in processes():
        if session == sid and pid != spare:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None  # gone, a zombie, or another user's


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def log_tail(path: Path, lines: int = 15) -> list[str]:
    """The last ``lines`` lines of a log file (reads only its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return f.read().decode("utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return ["(no log)"]


#: how a failure message quotes the end of a log: ``<headline>; last lines of <log>:`` then each line
#: indented by four spaces (and, from a multi-rank target, ``  then ...`` lines on how the others ended)
_QUOTES = "; last lines of "


def quoting_tail(headline: str, log: Path | str, lines: Sequence[str]) -> str:
    """A failure message that quotes the last ``lines`` of ``log`` (:func:`log_tail`)."""
    return f"{headline}{_QUOTES}{log}:\n" + "\n".join("    " + line for line in lines)


#: what a process the kernel's out-of-memory killer ended did, and what to change
OOM_KILLED = (
    "was killed by the out-of-memory killer (its memory cgroup counted an OOM kill); give it more memory or a "
    "smaller batch (trainer.batch_size)"
)


def _ended_with(code: int) -> str:
    """What a process's end says of it, for a failure message's headline."""
    return f"ended with {describe_exit(code)}" if code else ""


class QuotedTail(NamedTuple):
    """A failure message of :func:`quoting_tail`'s shape, read back: its headline, the log it quotes,
    the quoted lines (unindented) and any ``  then ...`` lines after them."""

    headline: str
    log: str
    lines: list[str]
    then: list[str]


def split_tail(message: str) -> QuotedTail | None:
    """``message`` read as :func:`quoting_tail` wrote it; None for a message that quotes no log."""
    headline, sep, rest = message.partition(_QUOTES)
    log, sep2, tail = rest.partition(":\n")
    if not (sep and sep2):
        return None
    lines = tail.splitlines()
    quoted = [line[4:] for line in lines if line.startswith("    ")]
    return QuotedTail(headline, log, quoted, [line for line in lines if line.startswith("  then ")])


class LogFollower:
    """Reads a log file that a job appends to, each read from where the previous one stopped (text
    decoded across chunk boundaries): how a handle streams a job's output from a file in its job
    directory (:meth:`ddlkit.JobHandle.logs`)."""

    def __init__(self, path: Path, *, pace_s: float = _FOLLOW_PACE_S, offset: int = 0) -> None:
        self.path, self.pace_s = Path(path), pace_s
        #: where reading starts: 0, or the end of what an earlier run of the job wrote
        self._offset = offset
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read_new(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return ""
        self._offset += len(data)
        return self._decoder.decode(data)

    def chunks(self, done: Callable[[], bool], *, follow: bool) -> Iterator[str]:
        """New text as it comes; without ``follow`` what there is now, with ``follow`` until
        ``done()`` (asked before each read, so what is written before the end is read)."""
        while True:
            finished = done()
            text = self.read_new()
            if text:
                yield text
            elif finished or not follow:
                return
            else:
                time.sleep(self.pace_s)


class ProcessJob(JobHandle):
    """A job run by the minder on this machine. ``id`` is the minder's pid.

    Subclasses refine :meth:`final_status` (``compute=local_mpi`` names the rank that failed first)."""

    def __init__(
        self,
        pid: int,
        *,
        job_dir: Path,
        log_name: str,
        grace_period_s: float,
        proc: subprocess.Popen | None = None,
        log_offset: int = 0,
    ) -> None:
        self.id = str(pid)
        self.pid, self.job_dir, self.grace = pid, Path(job_dir), grace_period_s
        self.log_path = self.job_dir / log_name
        #: the minder as our child: exact exit codes without reading files
        self.proc = proc
        self._log = LogFollower(self.log_path, offset=log_offset)
        self._final: JobStatus | None = None

    # ---------------------------------------------------------------- starting and finding
    @classmethod
    def start(
        cls,
        command: Sequence[str],
        *,
        job_dir: Path,
        log_name: str,
        env: Mapping[str, str],
        grace_period_s: float,
        stop_signal: int = signal.SIGTERM,
    ) -> ProcessJob:
        """Run ``command`` in ``job_dir`` (its working directory), its output appended to ``log_name``.
        ``stop_signal``: what ``command`` gets if the launcher dies before detaching the job (it
        stops as if cancelled)."""
        job_dir = Path(job_dir)
        (job_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
        # a resumed job runs in the same directory: the previous run's ending is not this one's
        for name in (EXIT_FILE, CANCEL_FILE, DETACHED_FILE):
            (job_dir / name).unlink(missing_ok=True)
        # and its log goes on in the same file: the launcher follows this run's lines only
        # (`ddlkit jobs logs` and `attach` show the whole file)
        try:
            log_offset = (job_dir / log_name).stat().st_size
        except FileNotFoundError:
            log_offset = 0
        # the minder gets the job directory's names as arguments: it imports nothing from ddlkit
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                _MINDER,
                log_name,
                EXIT_FILE,
                CANCEL_FILE,
                DETACHED_FILE,
                str(grace_period_s),
                str(int(stop_signal)),
                # the memory cgroup's OOM-kill counter: the command starts in this process's cgroup
                oom_kill_counter() or "-",
                "--",
                *command,
            ],
            cwd=job_dir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _OWNED.add(proc.pid)
        return cls(
            proc.pid,
            job_dir=job_dir,
            log_name=log_name,
            grace_period_s=grace_period_s,
            proc=proc,
            log_offset=log_offset,
        )

    @classmethod
    def attach(cls, job_id: str, *, job_dir: Path, log_name: str, grace_period_s: float) -> ProcessJob:
        from ..errors import ConfigError

        if not job_id.isdigit():
            raise ConfigError(f"{job_id!r} is not the id of a job on this machine (a process id).")
        return cls(int(job_id), job_dir=job_dir, log_name=log_name, grace_period_s=grace_period_s)

    def detach(self) -> None:
        write_text(self.job_dir / DETACHED_FILE, f"{time.time()}\n")
        _OWNED.discard(self.pid)

    # ---------------------------------------------------------------- state
    def _exit_code(self) -> int | None:
        """The command's exit code; None while it runs. A job whose session is gone without a
        record (the machine restarted) counts as killed (:meth:`status` says it is unknown how it ended)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                return None
        elif self._record() is None and self.session():
            # the minder, or what runs the job after the minder was killed (its guard kills that)
            return None
        # ended; read after the minder was seen gone, since it writes the record before it exits
        record = self._record()
        return record["code"] if record else -signal.SIGKILL

    def _record(self) -> dict | None:
        try:
            return json.loads((self.job_dir / EXIT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def session(self) -> list[int]:
        """The live processes of the job's session (its id is the minder's pid): the minder, its
        guard, the command and all it started -- if the session is this job's, that is if one of
        them works in the job directory (a recycled pid's session does not)."""
        pids = [pid for pid, _, sid in processes() if sid == self.pid]
        job_dir = str(self.job_dir.resolve())
        return pids if any(_cwd(p) == job_dir for p in pids) else []

    @property
    def cancel_requested(self) -> bool:
        return (self.job_dir / CANCEL_FILE).exists()

    def status(self) -> JobStatus:
        if self._final is not None:
            return self._final
        code = self._exit_code()
        if code is None:
            return JobStatus(JobState.RUNNING, None, f"process {self.pid} on this machine")
        _OWNED.discard(self.pid)
        if self.proc is None and self._record() is None:
            self._final = JobStatus(
                JobState.FAILED,
                None,
                (
                    f"how it ended is unknown: no process of job {self.id} runs on this machine and it left no exit "
                    f"record ({self.job_dir / EXIT_FILE}); the machine restarted, or its processes were killed"
                ),
            )
        else:
            self._final = self.final_status(code)
        return self._final

    def final_status(self, code: int) -> JobStatus:
        """The job's status once its command ended with ``code``, as :func:`~ddlkit.compute.outcome.judge`
        rules (the command is rank 0 itself; a launcher such as ``mpirun`` says more of its ranks)."""
        from .outcome import Observation, judge  # outcome reads this module's log helpers

        record = self._record() or {}
        if record.get("oom_killed") is True:  # the minder saw the command's memory cgroup count an OOM kill
            seen = Observation(JobState.FAILED, EXIT_OOM_KILLED, OOM_KILLED)
        else:
            seen = Observation(JobState.SUCCEEDED if code == 0 else JobState.FAILED, code, _ended_with(code))
        return judge(seen, self.job_dir, job="rank 0", world_size=1, log=self.log_path)

    def wait(self, timeout: float | None = None) -> JobStatus:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return JobStatus(JobState.RUNNING)
            return self.status()
        return self.poll_until_done(timeout, 0.1)

    # ---------------------------------------------------------------- output
    def logs(self, follow: bool = True) -> Iterator[str]:
        """The log from where the previous call stopped (the first call: from the start)."""
        return self._log.chunks(lambda: self.status().state.done, follow=follow)

    # ---------------------------------------------------------------- stopping
    def cancel(self) -> None:
        if self.status().state.done or self.cancel_requested:
            return
        write_text(self.job_dir / CANCEL_FILE, f"{time.time()}\n")
        try:
            os.kill(self.pid, signal.SIGTERM)  # the minder passes it on to the command
        except ProcessLookupError:
            # the minder was killed and what it ran lives on (its guard is killing it, or it had none)
            kill_session(self.pid, signal.SIGTERM)
        timer = threading.Timer(self.grace, self._kill)
        timer.daemon = True
        timer.start()

    def _kill(self) -> None:
        """After the grace period: kill the command and all it started, then the minder if it
        has not recorded the end within a few seconds."""
        if self.status().state.done:
            return
        kill_session(self.pid, signal.SIGKILL, spare=self.pid)
        deadline = time.monotonic() + 5
        while not self.status().state.done and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_session(self.pid, signal.SIGKILL)
