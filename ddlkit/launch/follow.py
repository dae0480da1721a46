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
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from ..checkpoint import latest_checkpoint
from ..compute import secret_file
from ..compute.process import split_tail
from ..compute.restarts import RestartPolicy, classify
from ..config import RestartConfig
from ..errors import DdlkitError, JobFailedError
from ..interfaces import ComputeTarget, JobHandle, JobState, JobStatus, RestartBudget
from ..jobdir import EXIT_CONFIG_ERROR, EXIT_PREEMPTED, RESTARTS_ENV, RESULT_FILE, STEPS_LOST_ENV, rank_log
from . import index
from .elastic import CapacityWait, Placement, place_restart_waiting
from .prepare import PreparedJob


def submit(
    job: PreparedJob,
    *,
    detach: bool = False,
    restart: dict[str, object] | None = None,
    budget: RestartBudget | None = None,
) -> JobHandle:
    """Submit the job and record it, so that ``ddlkit jobs`` finds it from any shell; ``restart``:
    this submission restarts the job, for the reason the entry gives (added to its record);
    ``budget``: the restart policy the target may apply in place (:attr:`JobSpec.restart`)."""
    handle = job.compute.submit(replace(job.spec, restart=budget))
    if detach:
        handle.detach()
    index.record(
        job.spec.name,
        job.spec.job_dir,
        str(job.redacted_config["compute"]["name"]),
        handle.id,
        detached=detach,
        restart=restart,
    )
    return handle


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


def settle(handle: JobHandle, status: JobStatus, job_dir: Path) -> JobStatus:
    """Once a job has ended: bring its files back, record its end, and apply ddlkit's rule for
    an end -- a job that exited cleanly but wrote no ``result.json`` has failed."""
    handle.collect()
    secret_file.remove(job_dir)  # a target's that keeps them there (Slurm); a restart's submit writes it again
    result_path = Path(job_dir) / RESULT_FILE
    if status.state is JobState.SUCCEEDED and not result_path.is_file():
        status = JobStatus(JobState.FAILED, status.exit_code, f"the job exited cleanly but wrote no {result_path}")
    with contextlib.suppress(DdlkitError):  # a job directory without a record still has a result
        index.load(job_dir).ended_with(status)
    return status


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
        out.write(
            f"ddlkit: detached; job {spec.name} runs on compute={job.redacted_config['compute']['name']} as "
            f"{handle.id}.\n  follow it: ddlkit jobs attach {spec.name}\n"
            f"  or: ddlkit jobs status|logs|cancel {spec.name}\n"
        )
        out.flush()
        return None
    progress_bar = live and "console" in job.redacted_config.get("logger", {})
    current = job.compute  # the target of the job's last run: fewer nodes after an elastic restart
    while True:
        status = follow(handle, out=out, progress_bar=progress_bar)
        assert status is not None
        status = settle(handle, status, spec.job_dir)
        policy.count_in_place(status)
        verdict = classify(status)
        if not policy.allows(verdict):
            break
        try:
            entry = policy.before_restart(verdict, status, spec.job_dir, job.redacted_config["trainer"]["resume"])
        except KeyboardInterrupt:
            out.write("\nddlkit: interrupted before the restart\n")
            break
        # asked after the backoff: a lost node may have come back in the meantime; with too few up,
        # the restart waits for capacity (restart.capacity_wait_s)
        try:
            placed = place_restart_waiting(
                job.compute, current, spec, job.redacted_config, capacity=capacity_wait(job, policy, out)
            )
        except KeyboardInterrupt:
            out.write("\nddlkit: interrupted while the restart waited for capacity\n")
            break
        if isinstance(placed, str):
            # the job's own failure was said at the restart: this is why it ends, in one line
            raise JobFailedError(
                f"job {spec.name} {placed}; it resumes from step {entry['resumed_from']} when run "
                f"again: {job.resume_hint}"
            )
        current = placed.target
        handle = resubmit(job, policy, entry, placed)
    # a failure on a target that restarts says why this one was not restarted; a cancel is no failure
    note = policy.why_not(verdict) if status.state is JobState.FAILED and policy.max_restarts else ""
    return outcome(status, job_dir=spec.job_dir, name=spec.name, resume_hint=job.resume_hint, out=out, note=note)


def resubmit(
    job: PreparedJob, policy: RestartPolicy, entry: dict[str, object], placed: Placement | None = None
) -> JobHandle:
    """Submit the job again, as the restart ``entry`` says (added to its record), on the target
    ``placed`` chose (:func:`~ddlkit.launch.elastic.place_restart`; None: the job's own); its ranks
    learn how many restarts and lost steps there were so far, for result.json. A job on fewer nodes
    than planned is restarted by the launcher alone, which places it on all of them again when they
    are back: its target gets no budget to restart it in place at its smaller size."""
    placed = placed or Placement(job.compute)
    restarted = replace(
        job.spec,
        env={**job.spec.env, **placed.env, RESTARTS_ENV: str(policy.done), STEPS_LOST_ENV: str(policy.steps_lost)},
    )
    shrunk = placed.target.nodes < job.compute.nodes
    return submit(
        replace(job, compute=placed.target, spec=restarted),
        restart={**entry, **placed.entry},
        budget=None if shrunk else policy.budget(),
    )


def restart_policy(job: PreparedJob, out: TextIO) -> RestartPolicy:
    """The job's restart policy (:func:`policy_for` its config's ``restart`` and its target)."""
    return policy_for(job.redacted_config.get("restart") or {}, job.compute, out)


def policy_for(options: Mapping[str, Any], target: ComputeTarget, out: TextIO) -> RestartPolicy:
    """``restart.max_restarts`` and ``restart.capacity_wait_s`` (or ``target``'s defaults) and
    ``restart.backoff_s``, from a config's ``restart`` options."""
    most, wait = options.get("max_restarts"), options.get("capacity_wait_s")
    return RestartPolicy(
        target.default_max_restarts if most is None else int(most),
        float(options.get("backoff_s", RestartConfig.backoff_s)),  # the schema's default, for a config without it
        out,
        capacity_wait_s=target.default_capacity_wait_s if wait is None else float(wait),
    )


def capacity_wait(job: PreparedJob, policy: RestartPolicy, out: TextIO, prefix: str = "ddlkit: ") -> CapacityWait:
    """The wait for capacity of the restart ``policy`` is about to make, at the target's pace."""
    return CapacityWait(
        policy.capacity_wait_s,
        job.compute.status_interval_s,
        out,
        restart=f"{policy.done}/{policy.max_restarts}",
        prefix=prefix,
    )
