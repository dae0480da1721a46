"""Keeps up to ``max_parallel`` jobs in flight through the compute contract (:class:`ddlkit.JobHandle`).

The scheduler knows nothing of Hydra or of ddlkit's configs: a job is a number, a label and a
``start()`` that returns a handle. It starts jobs while slots are free, asks each running job's
status at that job's own pace (its compute target's ``status_interval_s``: a local process
answers at once, a cluster's API is rate-limited), starts the next job as soon as one ends, and
applies the failure policy. It reads no logs: a target keeps each job's output itself. Because it uses only ``status``,
``logs``, ``cancel`` and ``wait``, any compute target's jobs can be scheduled, and so can the
forked tasks of a plain Hydra app (:mod:`ddlkit.launch.sweep.forked`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ...errors import DdlkitError
from ...interfaces import JobHandle, JobState, JobStatus
from .settings import FailurePolicy

#: outcome states; "pending" = never started (yet), "interrupted" = cancelled because the launcher was interrupted
STATES = ("pending", "running", "completed", "failed", "cancelled", "interrupted")


@dataclass(frozen=True)
class SweepJob:
    num: int
    #: how messages name the job, e.g. its overrides
    label: str
    #: submits the job (one attempt) and returns its handle; may raise to say it could not start
    start: Callable[[], JobHandle]
    #: seconds between status calls for this job; None: the scheduler's own pace
    status_interval_s: float | None = None
    #: the job goes on from where a run of it that completed left off (early stopping's next
    #: segment): a run of the same attempt, not an attempt of its own
    continues: bool = False


@dataclass
class Outcome:
    num: int
    state: str = "pending"
    #: attempts made (the first run plus retries)
    attempts: int = 0
    exit_code: int | None = None
    #: why the last attempt failed (the compute target's explanation)
    message: str = ""
    #: wall-clock times of the last attempt: start() called, start() returned, end seen
    submitted: float | None = None
    started: float | None = None
    ended: float | None = None
    #: seconds the job ran, all attempts together
    duration_s: float = 0.0
    #: the last attempt's handle
    handle: JobHandle | None = field(default=None, repr=False)


class Observer:
    """Told about each job as it starts and ends (also when the end is a failure to start)."""

    def started(self, job: SweepJob, outcome: Outcome) -> None:
        """An attempt of ``job`` was submitted."""

    def ended(self, job: SweepJob, outcome: Outcome, *, will_retry: bool) -> None:
        """An attempt ended in ``outcome.state``; ``will_retry``: the job goes back to the queue."""

    def follow_ups(self) -> list[SweepJob]:
        """Asked after each end: jobs to run before any other waiting one, in this order (a
        trial promoted by early stopping: its next segment)."""
        return []


@dataclass
class SweepRun:
    outcomes: dict[int, Outcome]
    #: the launcher was interrupted (Ctrl-C); running jobs were cancelled and waited for
    interrupted: bool = False
    #: fail-fast: the job whose failure stopped the sweep
    stopped_by: int | None = None


class Clock:
    """The time a scheduler reads and waits by: the system's; a test gives one of its own, so
    that what it checks (pace, order, slots) does not depend on how busy the machine is."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)
    #: wall-clock time, for the outcomes' submitted/started/ended (last: it shadows the module here)
    time = staticmethod(time.time)


class Scheduler:
    def __init__(
        self,
        max_parallel: int,
        policy: FailurePolicy,
        *,
        status_interval_s: float,
        observer: Observer | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.max_parallel = max_parallel
        self.policy = policy
        self.status_interval_s = status_interval_s
        self.observer = observer or Observer()
        self.clock = clock or Clock()

    def run(self, jobs: Sequence[SweepJob]) -> SweepRun:
        sweep = SweepRun({job.num: Outcome(job.num) for job in jobs})
        pending = deque(jobs)
        running: dict[int, SweepJob] = {}
        cancelled: set[int] = set()
        #: per running job, when to ask its status next (on the clock's monotonic time)
        self._next_poll: dict[int, float] = {}
        try:
            while pending or running:
                while pending and sweep.stopped_by is None and len(running) < self.max_parallel:
                    job = pending.popleft()
                    if self._start(job, sweep.outcomes[job.num]):
                        # tracked before anyone hears of it: an interrupt from here on cancels it too
                        running[job.num] = job
                        self._next_poll[job.num] = self.clock.monotonic() + self._pace(job)
                        self.observer.started(job, sweep.outcomes[job.num])
                    else:
                        self._after_failure(job, sweep, pending, running, cancelled)
                    pending.extendleft(reversed(self.observer.follow_ups()))
                if sweep.stopped_by is not None:
                    pending.clear()
                ended = self._poll(running, sweep, pending, cancelled)
                if not ended and running:
                    self.clock.sleep(max(0.0, min(self._next_poll[n] for n in running) - self.clock.monotonic()))
        except KeyboardInterrupt:
            self._interrupt(running, sweep)
        return sweep

    def _start(self, job: SweepJob, outcome: Outcome) -> bool:
        outcome.submitted = self.clock.time()
        try:
            handle = job.start()
        except Exception as err:
            # the job could not be prepared or the target refused it (a bad resume setting, an
            # unreachable cluster): a failed attempt like any other, so the policy decides what next
            outcome.attempts += 1
            outcome.started = outcome.ended = self.clock.time()
            outcome.state, outcome.exit_code, outcome.handle = "failed", None, None
            outcome.message = (
                f"could not start: {err}"
                if isinstance(err, DdlkitError)
                else (f"could not start: {type(err).__name__}: {err}")
            )
            return False
        outcome.attempts += 0 if job.continues else 1
        outcome.started, outcome.ended = self.clock.time(), None
        outcome.state, outcome.exit_code, outcome.message, outcome.handle = "running", None, "", handle
        return True

    def _pace(self, job: SweepJob) -> float:
        return job.status_interval_s if job.status_interval_s is not None else self.status_interval_s

    def _poll(
        self, running: dict[int, SweepJob], sweep: SweepRun, pending: deque[SweepJob], cancelled: set[int]
    ) -> bool:
        """Ask the status of each running job that is due; True if one ended."""
        ended = False
        now = self.clock.monotonic()
        for num, job in list(running.items()):
            if self._next_poll[num] > now:
                continue
            self._next_poll[num] = now + self._pace(job)
            outcome = sweep.outcomes[num]
            assert outcome.handle is not None
            if not outcome.handle.status().state.done:
                continue
            status = outcome.handle.wait()
            del running[num]
            ended = True
            self._record_end(outcome, status, cancelled_by_us=num in cancelled)
            if outcome.state == "failed":
                self._after_failure(job, sweep, pending, running, cancelled)
            else:
                self.observer.ended(job, outcome, will_retry=False)
            pending.extendleft(reversed(self.observer.follow_ups()))
        return ended

    def _record_end(self, outcome: Outcome, status: JobStatus, *, cancelled_by_us: bool) -> None:
        outcome.ended = self.clock.time()
        assert outcome.started is not None
        outcome.duration_s += outcome.ended - outcome.started
        outcome.exit_code = status.exit_code
        outcome.message = status.message
        if status.state is JobState.SUCCEEDED:
            outcome.state = "completed"
        elif cancelled_by_us:
            outcome.state = "cancelled"
        else:
            # a job cancelled by someone else (a cluster preempting it) failed as far as the sweep knows
            outcome.state = "failed"
            outcome.message = status.message or f"the job ended {status.state.value}"

    def _after_failure(
        self,
        job: SweepJob,
        sweep: SweepRun,
        pending: deque[SweepJob],
        running: dict[int, SweepJob],
        cancelled: set[int],
    ) -> None:
        outcome = sweep.outcomes[job.num]
        will_retry = outcome.attempts <= self.policy.retries and sweep.stopped_by is None
        self.observer.ended(job, outcome, will_retry=will_retry)
        if will_retry:
            # first in line: it has waited longest, and its directory holds the checkpoint to resume from
            pending.appendleft(replace(job, continues=False))  # a retry is an attempt
        elif self.policy.stop_on_failure and sweep.stopped_by is None:
            sweep.stopped_by = job.num
            for num in running:
                handle = sweep.outcomes[num].handle
                assert handle is not None
                handle.cancel()
                cancelled.add(num)

    def _interrupt(self, running: dict[int, SweepJob], sweep: SweepRun) -> None:
        """Ctrl-C: ask every running job to stop (ddlkit jobs checkpoint first) and wait for them."""
        sweep.interrupted = True
        for num in running:
            handle = sweep.outcomes[num].handle
            assert handle is not None
            handle.cancel()
        for num, job in running.items():
            outcome = sweep.outcomes[num]
            assert outcome.handle is not None
            self._record_end(outcome, outcome.handle.wait(), cancelled_by_us=True)
            if outcome.state == "cancelled":
                outcome.state = "interrupted"
            self.observer.ended(job, outcome, will_retry=False)
