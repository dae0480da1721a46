"""A prepared job, submitted and followed to its end: rank 0's output streamed (with the target's
word while the job waits), Ctrl-C and SIGTERM turned into a cancel, the job's files collected, and
its end told in one line -- how it ended, where its result is, how to resume it.

Hydra runs only in the launcher. What the ranks get is the job directory -- one resolved job file
(secrets redacted) that names no path of the launcher's -- plus the environment the job spec
carries; :mod:`ddlkit.rank.worker` trains from that file, wherever the directory is, and never
re-enters Hydra.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from ..checkpoint import latest_checkpoint
from ..compute.process import split_tail
from ..errors import JobFailedError
from ..interfaces import JobHandle, JobState, JobStatus
from ..jobdir import EXIT_CONFIG_ERROR, EXIT_PREEMPTED, RESULT_FILE, rank_log
from . import minder
from .controller import JobController, Restarts, restart_policy, settle, submit
from .minder import MINDER_LOG
from .prepare import PreparedJob


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """A SIGTERM to ddlkit (a batch scheduler's preemption, ``kill``) stops a job or a sweep as
    Ctrl-C does: the jobs checkpoint and stop, instead of running on without their launcher.
    Signal handlers belong to the main thread; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: seconds of silence after which :func:`follow` says what a job without output is doing, and
#: between its looks at the job's state until the first output comes
NOTICE_AFTER_S = 3.0


class _StateNotices:
    """Until a job's first output: its state and what its target says of it (a scheduler's reason
    for keeping it queued), once it has been silent for :data:`NOTICE_AFTER_S`, then on each change.
    A job that waits in a queue, or takes long to start, is never silent."""

    def __init__(self, handle: JobHandle, out: TextIO) -> None:
        self.handle, self.out = handle, out
        self.lock = threading.Lock()
        self.output = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ddlkit-job-state", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        said = None
        while not self.output.wait(NOTICE_AFTER_S):
            try:
                status = self.handle.status()
            except Exception:  # the stream asks too, and reports what is wrong
                return
            if status.state.done:
                return
            notice = (
                f"ddlkit: job {status.state.value}"
                + (f" ({status.message})" if status.message else "")
                + ", no output yet"
            )
            with self.lock:
                if notice != said and not self.output.is_set():
                    self.out.write(notice + "\n")
                    self.out.flush()
                    said = notice

    def stop(self) -> None:
        """The job's output has come (or the job ended): no more notices."""
        with self.lock:  # a notice is never written into the job's output
            self.output.set()


def _stream(handle: JobHandle, out: TextIO, progress_bar: bool) -> None:
    chunks = iter(handle.logs(follow=True))
    notices = _StateNotices(handle, out)
    try:
        first = next(chunks, None)
    finally:
        notices.stop()
    if first is None:
        return
    if progress_bar:
        from .progress import ProgressRenderer

        with ProgressRenderer(out) as renderer:
            for chunk in itertools.chain([first], chunks):
                renderer.feed(chunk)
    else:
        for chunk in itertools.chain([first], chunks):
            out.write(chunk)
            out.flush()


def follow(handle: JobHandle, *, out: TextIO, progress_bar: bool, on_interrupt: str = "cancel") -> JobStatus | None:
    """Stream the job's output until it ends and return its status. Ctrl-C (or SIGTERM) either
    cancels the job -- it checkpoints, and its last output is shown -- or, with
    ``on_interrupt="detach"``, leaves it running and returns None."""
    with sigterm_interrupts():
        try:
            _stream(handle, out, progress_bar)
            return handle.wait()
        except KeyboardInterrupt:
            if on_interrupt == "detach":
                handle.detach()
                return None
            out.write("\nddlkit: interrupted; asking the job to checkpoint and stop...\n")
            handle.cancel()
            for chunk in handle.logs(follow=True):
                out.write(chunk)
            return handle.wait()


def resumable(status: JobStatus, job_dir: Path) -> bool:
    """Whether the job's command, run again, resumes the ended job: its ranks stopped when told to
    (``EXIT_PREEMPTED``, while running), or it left a checkpoint. A job that failed before training,
    or was cancelled before it started, has nothing to resume: its message names the cause instead."""
    return status.exit_code == EXIT_PREEMPTED or latest_checkpoint(job_dir) is not None


def conclude(
    handle: JobHandle, status: JobStatus, *, job_dir: Path, name: str, resume_hint: str, out: TextIO
) -> dict[str, Any]:
    """After the job ended: :func:`settle` it, and return ``result.json`` (or raise
    :class:`JobFailedError` with what went wrong and how to resume)."""
    return outcome(settle(handle, status, job_dir), job_dir=job_dir, name=name, resume_hint=resume_hint, out=out)


#: a job directory at least this big is reported at the end of its run, with how to keep it smaller
BIG_JOB_DIR = 100_000_000


def footprint(job_dir: Path) -> str:
    """One line, for a job directory of :data:`BIG_JOB_DIR` or more: how much disk it takes and
    what takes most of it (checkpoints and the model are what a run leaves behind; a toy sweep of
    four jobs leaves half a gigabyte); else nothing."""
    sizes: dict[str, int] = {}
    for dirpath, _, filenames in os.walk(job_dir):
        top = Path(dirpath).relative_to(job_dir).parts
        for name in filenames:
            with contextlib.suppress(OSError):
                part = f"{top[0]}/" if top else name
                sizes[part] = sizes.get(part, 0) + os.lstat(os.path.join(dirpath, name)).st_size
    total = sum(sizes.values())
    if total < BIG_JOB_DIR:
        return ""
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:2]
    parts = ", ".join(f"{name} {_megabytes(size)}" for name, size in biggest if size >= total / 10)
    return (
        f"ddlkit: the job directory holds {_megabytes(total)}"
        + (f" ({parts})" if parts else "")
        + ": trainer.keep_checkpoints=1 and trainer.save_model=false keep it smaller\n"
    )


def _megabytes(size: int) -> str:
    """A size of 10 MB or more (the parts a footprint names)."""
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"


def outcome(
    status: JobStatus, *, job_dir: Path, name: str, resume_hint: str, out: TextIO, note: str = ""
) -> dict[str, Any]:
    """A settled job's ``result.json``, or :class:`JobFailedError` with what went wrong, ``note``
    (why it was not restarted) and how to resume."""
    if status.state is JobState.SUCCEEDED:
        result_path = Path(job_dir) / RESULT_FILE
        result = json.loads(result_path.read_text())
        out.write(footprint(Path(job_dir)))
        out.write(f"ddlkit: done; result in {result_path}\n")
        return result
    noted = f" ({note})" if note else ""
    if status.exit_code == EXIT_PREEMPTED:
        saved = "after saving a checkpoint" if latest_checkpoint(job_dir) is not None else "before its first checkpoint"
        raise JobFailedError(f"job {name} stopped {saved}{noted}; {resume_hint}", exit_code=EXIT_PREEMPTED)
    # a rank's config error (a model.target that does not import, a model of the wrong kind) is
    # fixed in the command, so the same command would only fail again
    resume = resumable(status, job_dir) and status.exit_code != EXIT_CONFIG_ERROR
    hint = f"\n  {resume_hint}" if resume else ""
    raise JobFailedError(
        f"job {name} {status.state.value}{noted}: {without_followed_tail(status.message)}{hint}",
        exit_code=status.exit_code if status.exit_code and status.exit_code > 0 else 1,
    )


def without_followed_tail(message: str) -> str:
    """A target's failure message with only the error line of the rank 0 log it quotes: the
    launcher followed that log, so the console has just shown its last lines (they were printed
    twice). The error stays, in one line, so that the error on stderr still says what went wrong
    on its own (a CI log, a sweep's). Another rank's lines stay whole: the console did not show them."""
    quoted = split_tail(message)
    if quoted is None or Path(quoted.log).name != rank_log(0):
        return message
    error = _error_line([line.strip() for line in quoted.lines if line.strip()])
    return f"{quoted.headline}{': ' + error if error else ''} (the whole log: {quoted.log})" + "".join(
        f"\n{line}" for line in quoted.then
    )


#: how a rank's one-line error starts (ddlkit.rank.worker), and how a Python exception's last line reads
_WORKER_ERROR = "ddlkit worker (rank "
_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b.*")


def _error_line(lines: list[str]) -> str:
    """The line of a log's tail that says what went wrong: the worker's own error line, else the
    last exception, else the last line."""
    for wanted in (lambda line: line.startswith(_WORKER_ERROR), _EXCEPTION_LINE.match):
        found = [line for line in lines if wanted(line)]
        if found:
            return found[-1]
    return lines[-1] if lines else ""


def run_job(
    job: PreparedJob, *, out: TextIO | None = None, live: bool | None = None, detach: bool = False
) -> dict[str, Any] | None:
    """Submit, stream rank 0's output, and return result.json; raise JobFailedError otherwise.
    With ``detach``: submit, say how to find the job again, and return None at once."""
    out = out or sys.stdout
    live = out.isatty() if live is None else live
    spec = job.spec
    out.write(f"ddlkit: job {spec.name} -> {spec.job_dir}\n")
    out.flush()
    policy = restart_policy(job, out)
    handle = submit(job, detach=detach, budget=policy.budget())
    if detach:
        # restarts under the job's policy go on without the launcher: its minder drives the controller
        restarts = f"; its minder restarts it (log: {spec.job_dir / MINDER_LOG})" if policy.max_restarts else ""
        if restarts:
            minder.start(job, handle.id)
        out.write(
            f"ddlkit: detached; job {spec.name} runs on compute={job.redacted_config['compute']['name']} as "
            f"{handle.id}{restarts}.\n  follow it: ddlkit jobs attach {spec.name}\n"
            f"  or: ddlkit jobs status|logs|cancel {spec.name}\n"
        )
        out.flush()
        return None
    progress_bar = live and "console" in job.redacted_config.get("logger", {})
    life = JobController(handle, spec.job_dir, Restarts(job, policy))
    with sigterm_interrupts():  # from the submission on: a SIGTERM to ddlkit stops the job as Ctrl-C does
        while True:
            # the current run, streamed to its end (Ctrl-C cancels it: it checkpoints, and the job ends with it)
            ended = follow(life.inner, out=out, progress_bar=progress_bar)
            try:
                status = life.step(ended)
                while life.between_runs:  # the backoff before a restart, or its wait for capacity
                    time.sleep(life.next_step_in())
                    status = life.step()
            except KeyboardInterrupt:
                life.cancel()
                # nothing runs between two runs: the job stops where its last checkpoint left it
                checkpoint = latest_checkpoint(spec.job_dir)
                saved = f"its checkpoint {checkpoint.name}" if checkpoint is not None else "no checkpoint yet"
                stopped = f"job {spec.name} stopped before its restart ({life.restarts_used()}), with {saved}"
                raise JobFailedError(
                    f"{stopped}; {job.resume_hint}",
                    exit_code=EXIT_PREEMPTED,
                ) from None
            if status.state.done:
                break
    if life.refused is not None:
        # the job's own failure was said at the restart: this is why it ends, in one line
        why, entry = life.refused
        raise JobFailedError(
            f"job {spec.name} {why}; it resumes from step {entry['resumed_from']} when run again: {job.resume_hint}"
        )
    note = life.why_not
    return outcome(status, job_dir=spec.job_dir, name=spec.name, resume_hint=job.resume_hint, out=out, note=note)
