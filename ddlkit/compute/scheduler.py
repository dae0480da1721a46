"""What a compute plugin implements to run jobs on a scheduler, and the one handle the core keeps
over any of them.

A cluster's scheduler (Slurm, a Ray cluster's job API, Azure ML, Batch AI, Kubernetes) is reached
through a narrow adapter, a :class:`Scheduler`: it says what it sees of a job (:meth:`~Scheduler.describe`,
an :class:`~ddlkit.compute.outcome.Observation`), passes a stop or a kill on, reads the job's log and
brings its files back. Everything else about a job's life is the core's, in :class:`SchedulerJob`:

* how the job ended -- :func:`ddlkit.compute.outcome.judge`, from the ranks' exit records, never a
  target's own rule;
* asking at the target's pace (``poll_interval_s``: a scheduler's API has rate limits) and keeping
  the final status once the job ended;
* the cancel protocol: the cancel mark (``CANCEL_FILE``) first, then ``stop`` (the ranks checkpoint),
  then ``kill`` after the grace period; a job still queued is killed at once;
* following the log, and fetching the job's files before it is judged (a target that copies the job
  directory to its nodes brings the ranks' records back with them).

A target builds one ``SchedulerJob`` per submission::

    class KubernetesTarget(ddlkit.ComputeTarget):
        def submit(self, spec):
            scheduler = KubernetesScheduler(self.cfg)
            return SchedulerJob(scheduler, scheduler.submit(spec), job_dir=spec.job_dir,
                                world_size=self.world_size, poll_interval_s=self.cfg.poll_interval_s,
                                grace_period_s=self.cfg.grace_period_s)
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from ..atomic import write_text
from ..interfaces import JobHandle, JobState, JobStatus
from ..jobdir import CANCEL_FILE
from .outcome import Observation, judge

__all__ = ["Scheduler", "SchedulerJob"]

#: seconds between reads of a log that is being followed
_FOLLOW_PACE_S = 0.1


class Scheduler(ABC):
    """The adapter to one scheduler: what it sees, how to stop a job, its log and its files. It
    decides nothing about how a job ended (:func:`~ddlkit.compute.outcome.judge` does)."""

    #: what messages call a job of this scheduler: ``f"{noun} {job_id}"`` ("Slurm job 12")
    noun: str = "job"
    #: extra seconds after the grace period before a stopped job is killed: what the scheduler
    #: takes to pass a stop on to every rank
    kill_slack_s: float = 0.0

    @abstractmethod
    def describe(self, job_id: str) -> Observation:
        """What the scheduler says of the job now. Raise :class:`ddlkit.RunError` (or
        :class:`ddlkit.ConfigError`) with what to do when it cannot be asked."""

    def look(self, job_id: str) -> Observation | None:
        """A cheap look asked before every paced :meth:`describe` (a record the job leaves on a shared
        disk when it ends): the observation it gives, or None to wait for the scheduler's word."""
        return None

    @abstractmethod
    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        """``stop``: ask the ranks to checkpoint and stop (a queued job: remove it); ``kill``: end the
        job now. Both are no-ops on a job that has ended."""

    @abstractmethod
    def read_log(self, job_id: str, offset: int) -> str:
        """The job's output (rank 0's, as the scheduler keeps it) from character ``offset`` on."""

    def follow_log(self, job_id: str, offset: int, done: Callable[[], bool]) -> Iterator[str]:
        """The job's output from ``offset`` as it comes, until ``done()`` (asked before each read, so
        what was written before the end is read). A scheduler that streams logs says so here."""
        while True:
            finished = done()
            text = self.read_log(job_id, offset)
            offset += len(text)
            if text:
                yield text
            elif finished:
                return
            else:
                time.sleep(_FOLLOW_PACE_S)

    def fetch(self, job_id: str, job_dir: Path) -> None:  # noqa: B027 -- optional; a no-op on a shared disk
        """Bring what the ranks wrote into the launcher's ``job_dir``; a no-op where the ranks run in
        it (a shared disk). Called once the job ended, before it is judged, and again by ``collect``."""

    def peek(self, job_id: str, job_dir: Path) -> None:  # noqa: B027 -- optional; a no-op on a shared disk
        """Bring the files a running job keeps current (``telemetry.json``) into the launcher's
        ``job_dir``, where the ranks write elsewhere; best effort: a job that cannot be asked now
        leaves the last copy as it is."""

    def detach(self, job_id: str) -> None:  # noqa: B027 -- optional
        """Let the job outlive this process (a scheduler whose jobs are this process's children)."""


class SchedulerJob(JobHandle):
    """A job on a :class:`Scheduler`: the one :class:`~ddlkit.JobHandle` the core keeps over any."""

    def __init__(
        self,
        scheduler: Scheduler,
        job_id: str,
        *,
        job_dir: Path,
        world_size: int,
        poll_interval_s: float,
        grace_period_s: float,
        log: Path | None = None,
        node_names: Sequence[str] | None = None,
    ) -> None:
        self.scheduler, self.id = scheduler, str(job_id)
        self.job_dir, self.world_size = Path(job_dir), world_size
        self.poll_interval_s, self.grace = poll_interval_s, grace_period_s
        #: the scheduler's log of the job as a file here (quoted by failure messages), if it keeps one
        self.log_path = log
        self.node_names = node_names
        self._seen: tuple[float, Observation] | None = None
        self._final: JobStatus | None = None
        self._fetched = False
        self._offset = 0

    @property
    def name(self) -> str:
        return f"{self.scheduler.noun} {self.id}"

    @property
    def cancel_requested(self) -> bool:
        return (self.job_dir / CANCEL_FILE).exists()

    # ---------------------------------------------------------------- state
    def observe(self, *, fresh: bool = False) -> Observation:
        """What the scheduler says now; asked again only after ``poll_interval_s`` unless ``fresh``."""
        quick = self.scheduler.look(self.id)
        if quick is not None:
            return quick
        now = time.monotonic()
        if fresh or self._seen is None or now - self._seen[0] >= self.poll_interval_s:
            self._seen = (now, self.scheduler.describe(self.id))
        return self._seen[1]

    def status(self) -> JobStatus:
        if self._final is not None:
            return self._final
        seen = self.observe()
        if not seen.state.done:
            return JobStatus(seen.state, None, seen.reason)
        if not self._fetched:
            # the ranks' records come with the job's files; what cannot be fetched now, collect() says
            with contextlib.suppress(Exception):
                self.scheduler.fetch(self.id, self.job_dir)
                self._fetched = True
        self._final = judge(
            seen,
            self.job_dir,
            job=self.name,
            world_size=self.world_size,
            log=self.log_path,
            tail=None if self.log_path is not None else self._tail(),
            node_names=self.node_names,
        )
        return self._final

    def _tail(self, lines: int = 15) -> list[str]:
        try:
            return self.scheduler.read_log(self.id, 0).splitlines()[-lines:]
        except Exception:  # the message says how the job ended without its log
            return ["(its log could not be read)"]

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self.poll_until_done(timeout, min(self.poll_interval_s, 0.5))

    # ---------------------------------------------------------------- output
    def logs(self, follow: bool = True) -> Iterator[str]:
        if not follow:
            text = self.scheduler.read_log(self.id, self._offset)
            self._offset += len(text)
            if text:
                yield text
            return
        for text in self.scheduler.follow_log(self.id, self._offset, lambda: self.status().state.done):
            self._offset += len(text)
            yield text

    # ---------------------------------------------------------------- stopping
    def cancel(self) -> None:
        if self._final is not None or self.cancel_requested:
            return
        seen = self.observe(fresh=True)
        if seen.state.done:
            return
        write_text(self.job_dir / CANCEL_FILE, f"{time.time()}\n")
        if seen.state is JobState.PENDING:
            self.scheduler.signal(self.id, "kill")
            return
        self.scheduler.signal(self.id, "stop")
        self._seen = None
        timer = threading.Timer(self.grace + self.scheduler.kill_slack_s, self._kill)
        timer.daemon = True
        timer.start()

    def _kill(self) -> None:
        with contextlib.suppress(Exception):  # the job ended, or the scheduler cannot be asked: nothing to kill
            if not self.status().state.done:
                self.scheduler.signal(self.id, "kill")

    # ---------------------------------------------------------------- files
    def collect(self) -> None:
        self.scheduler.fetch(self.id, self.job_dir)
        self._fetched = True

    def peek(self) -> None:
        self.scheduler.peek(self.id, self.job_dir)

    def detach(self) -> None:
        self.scheduler.detach(self.id)
