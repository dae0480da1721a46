"""One job's life after its submission, one step at a time: the one restart loop, which a single job
(:func:`ddlkit.launch.follow.run_job`) and every job of a sweep (:mod:`ddlkit.launch.sweep.sweep`) drive.

A :class:`JobController` is the job's :class:`~ddlkit.JobHandle` across its runs. Each
:meth:`~JobController.step` looks once and returns at once -- never blocking on a backoff or a wait
for capacity, so a sweep steps its other jobs in between -- and does what the job's state calls for::

    running   the current run goes on                                     -> RUNNING
    ended     settle it (files collected, end recorded, no result.json = failed),
              count the restarts the target made in place, classify the end
              (ddlkit.compute.restarts): the job's own failure, a cancel,
              or no restarts left                                         -> its end, why not restarted
              the infrastructure's, with restarts left: say the restart,
              record it, start the backoff                                -> RUNNING ("restarting in N s")
    backoff   over: place the restart (an elastic job on the nodes up     -> RUNNING (resubmitted)
              now); too few nodes up: wait for capacity, looking again    -> RUNNING ("waiting for capacity")
              at the target's pace; the wait over, or the target refusing
              the resubmission                                            -> the last run's end, why not restarted

A cancel ends the job as its current run ends; between two runs nothing runs, and it ends at once.
A target that restarts a job's ranks in place (``compute=ray``) applies the same policy where they run
(:class:`~ddlkit.RestartBudget`) and reports those restarts with the run's end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TextIO

from ..compute import secret_file
from ..compute.restarts import RestartPolicy, Verdict, classify
from ..config import RestartConfig
from ..errors import DdlkitError
from ..interfaces import ComputeTarget, JobHandle, JobState, JobStatus, RestartBudget
from ..jobdir import RESTARTS_ENV, RESULT_FILE, STEPS_LOST_ENV
from . import index
from .elastic import CapacityWait, Placement, Shortfall, place_restart
from .prepare import PreparedJob

__all__ = [
    "JobController",
    "Restarts",
    "capacity_wait",
    "policy_for",
    "restart_policy",
    "resubmit",
    "settle",
    "submit",
]


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


def restart_policy(job: PreparedJob, out: TextIO) -> RestartPolicy:
    """The job's restart policy (:func:`policy_for` its config's ``restart`` and its target)."""
    return policy_for(restart_config(job.redacted_config.get("restart") or {}), job.compute, out)


def restart_config(options: Mapping[str, Any]) -> RestartConfig:
    """A config's ``restart`` options (job.json's plain copy, or the composed node), typed by their
    schema: what a config leaves out takes the schema's default, there and only there."""
    return RestartConfig(**{f.name: options[f.name] for f in fields(RestartConfig) if f.name in options})


def policy_for(restart: RestartConfig, target: ComputeTarget, out: TextIO) -> RestartPolicy:
    """``restart.max_restarts`` and ``restart.capacity_wait_s`` (or ``target``'s defaults where they
    are null) and ``restart.backoff_s``."""
    most, wait = restart.max_restarts, restart.capacity_wait_s
    return RestartPolicy(
        target.default_max_restarts if most is None else most,
        restart.backoff_s,
        out,
        capacity_wait_s=target.default_capacity_wait_s if wait is None else wait,
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


def resubmit(
    job: PreparedJob,
    policy: RestartPolicy,
    entry: dict[str, object],
    placed: Placement | None = None,
    *,
    detach: bool = False,
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
        detach=detach,
        restart={**entry, **placed.entry},
        budget=None if shrunk else policy.budget(),
    )


class Restarts:
    """What a job needs to be restarted: the prepared job, its restart policy, how the console names
    it (``prefix``: a sweep's job number), whom to tell of each restart (a sweep's ledger), and whether
    its runs outlive this process (``detach``: a detached job's minder, :mod:`ddlkit.launch.minder`)."""

    def __init__(
        self,
        job: PreparedJob,
        policy: RestartPolicy,
        prefix: str = "ddlkit: ",
        restarted: Callable[[dict[str, Any], JobHandle], None] | None = None,
        *,
        detach: bool = False,
    ) -> None:
        self.job, self.policy, self.prefix, self.detach = job, policy, prefix, detach
        self.restarted = restarted or (lambda entry, handle: None)


class JobController(JobHandle):
    """A job across its runs (see the module's docstring). ``inner`` is its current run's handle;
    without ``restarts`` the controller only settles it. ``annotate``: a final failure's message says
    why the job was not restarted on its first line (what a sweep's ledger and report show); a single
    job's launcher says it in its own error instead (:attr:`why_not`, :attr:`refused`)."""

    def __init__(
        self, inner: JobHandle, job_dir: Path, restarts: Restarts | None = None, *, annotate: bool = False
    ) -> None:
        self.inner, self.job_dir, self.id = inner, Path(job_dir), inner.id
        self.restarts, self.annotate = restarts, annotate
        #: why the ended job was not restarted ("not restarted: ..."); empty while it runs, and for a
        #: job that succeeded, was cancelled, or whose target never restarts
        self.why_not = ""
        #: the restart that could not be made (the wait for capacity over, the target refusing): why,
        #: and the restart's entry (the step a run again resumes from)
        self.refused: tuple[str, dict[str, Any]] | None = None
        self._settled: JobStatus | None = None
        #: between a failure and its restart: when to resubmit (the monotonic clock), the restart's
        #: entry, and the failed run's settled status
        self._pending: tuple[float, dict[str, Any], JobStatus] | None = None
        #: cancelled: whatever ends the current run is the job's end
        self._cancelled = False
        #: the target of the job's last run, when a restart put it on fewer nodes (None: the job's own)
        self._target: ComputeTarget | None = None
        #: the pending restart's wait for capacity, once a look found too few nodes up
        self._capacity: CapacityWait | None = None

    # ---------------------------------------------------------------- the step
    def step(self, ended: JobStatus | None = None) -> JobStatus:
        """Look once, do what the job's state calls for, and return at once. ``ended``: the current
        run's end, when the caller has waited for it (:meth:`JobHandle.wait`)."""
        if self._settled is not None:
            return self._settled
        if self._pending is not None:
            if time.monotonic() < self._pending[0]:
                return self._between()
            self._resubmit()
            if self._pending is not None:  # still waiting for capacity
                return self._between()
            if self._settled is not None:
                return self._settled
        return self._settle(ended if ended is not None and ended.state.done else self.inner.status())

    def restarts_used(self) -> str:
        """``1 of restart.max_restarts=3 restarts used``."""
        used = self.restarts.policy if self.restarts is not None else None
        return (
            "no restarts" if used is None else f"{used.done} of restart.max_restarts={used.max_restarts} restarts used"
        )

    @property
    def between_runs(self) -> bool:
        """Whether the job waits for a restart (its backoff, or capacity): nothing of it runs."""
        return self._pending is not None and self._settled is None

    def next_step_in(self) -> float:
        """Seconds until a step has something new to do (0 while a run is going on)."""
        return 0.0 if self._pending is None else max(0.0, self._pending[0] - time.monotonic())

    def _settle(self, status: JobStatus) -> JobStatus:
        if not status.state.done:
            return status
        settled = settle(self.inner, status, self.job_dir)
        if self.restarts is None:
            self._settled = settled
            return settled
        policy, verdict = self.restarts.policy, classify(settled)
        policy.count_in_place(settled)
        for entry in settled.restarts:  # made by the target, where the job ran: recorded too
            self.restarts.restarted(dict(entry), self.inner)
        if policy.allows(verdict) and not self._cancelled:
            entry = policy.plan_restart(
                verdict,
                settled,
                self.job_dir,
                self.restarts.job.redacted_config["trainer"]["resume"],
                prefix=self.restarts.prefix,
            )
            self._pending = (time.monotonic() + float(entry["wait_s"]), entry, settled)
            return self._between()
        return self._end(settled, verdict)

    def _end(self, settled: JobStatus, verdict: Verdict | None, why: str = "") -> JobStatus:
        """The job's end: ``settled``, with why it was not restarted (``why``, or the policy's word)."""
        assert self.restarts is not None
        if not why and verdict is not None and settled.state is JobState.FAILED and self.restarts.policy.max_restarts:
            why = self.restarts.policy.why_not(verdict)
        self.why_not = why
        if why and self.annotate:
            head, _, rest = settled.message.partition("\n")
            settled = replace(settled, message=f"{head} ({why})" + (f"\n{rest}" if rest else ""))
        self._settled = settled
        return settled

    def _between(self) -> JobStatus:
        assert self._pending is not None
        if self._capacity is not None:
            waited = self._capacity.waited_s or 0.0
            return JobStatus(
                JobState.RUNNING,
                None,
                f"restart waiting for capacity ({waited:.0f} of restart.capacity_wait_s={self._capacity.wait_s:g} s)",
            )
        return JobStatus(JobState.RUNNING, None, f"restarting in {self.next_step_in():.0f} s")

    def _resubmit(self) -> None:
        """Submit the job again (an elastic job on the nodes that are up now); with fewer nodes up
        than it needs, look again later, as long as ``restart.capacity_wait_s`` allows. If the target
        refuses (unreachable, out of quota) or the wait for capacity is over, the job ends as its last
        run did, with why it was not restarted."""
        assert self._pending is not None and self.restarts is not None
        _, entry, ended = self._pending
        self._pending = None
        job, policy = self.restarts.job, self.restarts.policy
        why = ""
        try:
            capacity = self._capacity or capacity_wait(job, policy, policy.out, self.restarts.prefix)
            placed = place_restart(
                job.compute,
                self._target or job.compute,
                job.spec,
                job.redacted_config,
                restart=capacity.restart,
                out=policy.out,
                prefix=self.restarts.prefix,
                waited_s=capacity.waited_s,
            )
            if isinstance(placed, Shortfall):
                pause = capacity.next_look(placed)
                if pause is not None:  # looked at again at the next step after the pause
                    self._pending, self._capacity = (time.monotonic() + pause, entry, ended), capacity
                    return
                why = capacity.failure(placed)
            else:
                self.inner = resubmit(job, policy, entry, placed, detach=self.restarts.detach)
                self._target = placed.target
        except DdlkitError as err:
            why = f"not restarted: its restart could not be submitted: {err}"
        self._capacity = None
        if why:
            self.refused = (why, entry)
            self._end(ended, None, why)
            return
        self.id = self.inner.id
        self.restarts.restarted(entry, self.inner)

    # ---------------------------------------------------------------- the JobHandle
    def status(self) -> JobStatus:
        return self.step()

    def logs(self, follow: bool = True) -> Iterator[str]:
        """The current run's output."""
        return self.inner.logs(follow)

    def cancel(self) -> None:
        self._cancelled = True
        if self._pending is not None:
            # between two runs nothing runs: the job ends as its last run did
            self._settled, self._pending = self._pending[2], None
            return
        self.inner.cancel()

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Until the job's end, its restarts included (``timeout``: the current run's wait)."""
        while self._settled is None:
            if self._pending is not None:
                time.sleep(self.next_step_in())
                self.step()
                continue  # settled, resubmitted, or still waiting for capacity
            status = self._settle(self.inner.wait(timeout))
            if timeout is not None and self._settled is None:
                return status
        return self._settled

    def detach(self) -> None:
        self.inner.detach()
