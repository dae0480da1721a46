"""How a job ended: one rule for every compute target.

A scheduler knows a job's state and an exit code, and its own reason ("TIMEOUT", "node failure");
it does not know which rank failed first, nor why. The ranks know: each rank's minder leaves an exit
record in the job directory (:mod:`ddlkit.compute.rank_exits`). A target says what its scheduler
sees, as an :class:`Observation`, and :func:`judge` decides the job's :class:`~ddlkit.JobStatus`::

    seen = Observation(JobState.FAILED, exit_code=143, reason="ended NODE_FAIL (node-3 down)")
    status = judge(seen, job_dir, job=f"Slurm job {job_id}", world_size=8, log=job_dir / "slurm.log")

The rule, in order:

1. **A cancel mark wins.** A job that ``ddlkit jobs cancel`` (or Ctrl-C) asked to stop is CANCELLED,
   whatever its ranks or its scheduler say of their ends.
2. **The ranks' records win over the scheduler.** The rank that failed first (the named-peer rule of
   :func:`~ddlkit.compute.rank_exits.first_failure`) gives the job its exit status, which the restart
   policy judges; the scheduler's reason stays in the message. A rank that its peers name as silent and
   that left no record failed first: it stopped answering, or was killed with its minder (the
   scheduler may have seen its signal: :attr:`Observation.rank_signals`). A rank whose minder saw the
   kernel's out-of-memory killer end it (``oom_killed`` in its record) ends the job with
   :data:`~ddlkit.jobdir.EXIT_OOM_KILLED`, which is never restarted: the same job would meet it again.
   Where the minder could not read its memory cgroup's count, an OOM kill is a SIGKILL like any other
   (a lost node's), and restarted.
3. **Pre-emption and notice.** Ranks that checkpointed and stopped (``EXIT_PREEMPTED``) ended on
   notice, at a step boundary: resumable, no step lost.
4. **Nothing reported**: the scheduler's exit code is all there is.

One message shape: ``<job> <reason>; <what the ranks did>; last lines of <log>:`` then the quoted lines
(:func:`~ddlkit.compute.process.quoting_tail`), then ``  then ...`` lines on how the other ranks ended.
When a rank's failure says it all and the scheduler gives no reason, ``<job> <reason>; `` is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..interfaces import JobState, JobStatus
from ..jobdir import CANCEL_FILE, EXIT_OOM_KILLED, EXIT_PREEMPTED
from .process import describe_exit, log_tail, quoting_tail
from .rank_exits import RankFailure, first_failure, named_peer, read_records

__all__ = ["Observation", "judge"]


@dataclass(frozen=True)
class Observation:
    """What a scheduler says of a job, with nothing decided: its state as the scheduler sees it, the
    exit code it reports (srun's, mpirun's, a service's), and its reason in words."""

    state: JobState
    exit_code: int | None = None
    #: while the job runs, one line on where it is ("Slurm: PENDING, reason Resources"); once it is
    #: done, what completes "<job> ..." ("ended NODE_FAIL (node-3)", "ran out of time (time limit
    #: 01:00:00)"); empty: the state says it
    reason: str = ""
    #: said after :attr:`reason` when the ranks did not checkpoint before the end (what to change so
    #: that they do: "raise compute.time")
    unless_saved: str = ""
    #: the exit codes the scheduler saw of ranks that may have left no record (mpirun's "process rank 1
    #: exited on signal 9": ``{1: -9}``)
    rank_signals: Mapping[int, int] = field(default_factory=dict)
    #: whether every rank of a successful job has left its record by the time the scheduler says it
    #: ended (ranks started by a launcher on this machine): then a success with a rank missing failed
    ranks_always_report: bool = False
    #: the restarts the target made in place (:attr:`ddlkit.JobStatus.restarts`)
    restarts: tuple[Mapping[str, Any], ...] = ()
    #: False: the job ended before any rank started (the scheduler refused it, or the target removed it
    #: from the queue: it could never start); its message is then :attr:`reason` alone, one line
    started: bool = True


_SAID = {JobState.SUCCEEDED: "ended", JobState.FAILED: "failed", JobState.CANCELLED: "was cancelled"}


def judge(
    seen: Observation,
    job_dir: Path,
    *,
    job: str,
    world_size: int,
    log: Path | str | None = None,
    tail: Sequence[str] | None = None,
    node_names: Sequence[str] | None = None,
) -> JobStatus:
    """The job's status from what its scheduler saw (``seen``) and the records its ranks left in
    ``job_dir``. ``job`` names it in messages ("Slurm job 12"); ``log`` is the scheduler's log of the
    job (the batch output), quoted when no rank's record says more, ``tail`` its last lines when it
    is not a file here (default: read from ``log``); ``node_names``: see
    :attr:`~ddlkit.compute.rank_exits.RankFailure.node_names`."""
    if not seen.state.done:
        return JobStatus(seen.state, None, seen.reason)
    job_dir = Path(job_dir)
    records = read_records(job_dir)
    failure = first_failure(job_dir, world_size, records=records, node_names=node_names)
    cancelled = seen.state is JobState.CANCELLED or (job_dir / CANCEL_FILE).exists()
    complete = len(records) >= world_size or not seen.ranks_always_report
    restarts = tuple(seen.restarts)
    if seen.state is JobState.SUCCEEDED and failure is None and complete and not cancelled:
        return JobStatus(JobState.SUCCEEDED, 0, restarts=restarts)

    state = JobState.CANCELLED if cancelled else JobState.FAILED
    code = failure.code if failure is not None else seen.exit_code
    reason = seen.reason or _SAID[seen.state]
    if cancelled and not reason.startswith("was cancelled"):
        reason = f"was cancelled ({reason})"
    saved = code == 0 if cancelled else code == EXIT_PREEMPTED
    head = f"{job} {reason}" + (f" {seen.unless_saved}" if seen.unless_saved and not saved else "")
    if not seen.started and failure is None:  # no rank ran, no log to quote: the reason says it all
        return JobStatus(state, code, head, restarts=restarts)

    if failure is not None and failure.code != EXIT_PREEMPTED:
        # the rank says it all; what the scheduler adds (its reason, a cancel) comes first
        headline = _headline(failure, seen)
        if seen.reason or cancelled or seen.unless_saved:
            headline = f"{head}; {headline}"
        return JobStatus(state, code, failure.message(headline), restarts=restarts)
    if failure is not None:  # every rank that failed checkpointed and stopped: on notice
        what = f"the ranks checkpointed and stopped (exit {EXIT_PREEMPTED})"
    elif code == EXIT_PREEMPTED:
        what = f"the ranks checkpointed and stopped (exit {code})"
    elif seen.state is JobState.SUCCEEDED or (seen.ranks_always_report and len(records) < world_size):
        # ended cleanly, yet a rank never said it did: killed with its minder
        code = code or 1
        what = f"{len(records)} of {world_size} ranks reported an exit"
    elif code is not None and describe_exit(code) not in reason and code != EXIT_OOM_KILLED:
        what = f"the ranks ended with {describe_exit(code)}"
    elif code is not None:  # the reason says it: "mpirun ended with exit status 1", "was killed by the OOM killer"
        what = ""
    else:
        what = "no rank reported how it ended"
    said = f"{head}; {what}" if what else head
    if log is None and tail is None:
        return JobStatus(state, code, said, restarts=restarts)
    lines = list(tail) if tail is not None else log_tail(Path(log)) if log is not None else []
    return JobStatus(state, code, quoting_tail(said, log or "its log", lines), restarts=restarts)


def _headline(failure: RankFailure, seen: Observation) -> str:
    """Which rank failed first, where and how. The first rank to report a failure may only have
    waited for another, which its error names: a named rank that reported its own failure is already
    the one :func:`first_failure` returns; one that reported nothing was stopped (SIGSTOP, a hang) or
    killed with its minder, and failed first."""
    named = named_peer(failure.tail)
    if named is None or named[0] == failure.rank or any(r["rank"] == named[0] for r in failure.records):
        return failure.headline()
    rank, how = named
    if rank in seen.rank_signals:
        culprit = f"rank {rank} was {describe_exit(seen.rank_signals[rank])}"
    else:
        culprit = f"rank {rank} {'stopped answering' if how == 'did not reach' else 'left the job'}"
    waiting = f"rank {failure.rank} ({failure.where()}) failed waiting for it"
    return f"{culprit} first; {waiting}, with {describe_exit(int(failure.first['code']))}"
