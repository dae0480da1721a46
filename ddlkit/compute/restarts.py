"""The restart policy, the same for every compute target: a job that the infrastructure ended starts
again in its own job directory, where its ranks resume from the newest verified checkpoint.

How an end is classified (from the target's :class:`~ddlkit.interfaces.JobStatus`: the exit status
of the rank that failed first):

* **the infrastructure's** -- restarted, up to ``restart.max_restarts`` times (null: the target's
  ``default_max_restarts``), after ``restart.backoff_s`` seconds, doubled for each restart after it:
  a rank killed by SIGKILL, SIGTERM, SIGHUP or SIGINT from outside (a lost node, a preempted VM, a
  scheduler); ranks stopped on notice after a checkpoint (``EXIT_PREEMPTED``); a rank that stopped
  because another was lost, went silent past ``dist.timeout_s`` or never joined (``EXIT_LOST_PEER``);
* **the job's own** -- never restarted, because the same code would fail again: a config error, a
  plugin error, an exception in the model or data code (NaN loss and out-of-memory included), a
  crash in native code (SIGSEGV, SIGABRT, ...), a rank the kernel's out-of-memory killer ended
  (``EXIT_OOM_KILLED``: its minder saw its memory cgroup count the kill; where it cannot be read, that
  SIGKILL looks like a lost node's and is restarted); a cancelled job is not restarted either.

Every restart is a line on the console and an entry in the job's record (``ddlkit jobs status``):
the cause, the step the job had reached, the step it resumes from. The ranks learn how many
restarts and lost steps there were (``DDLKIT_RESTARTS``, ``DDLKIT_STEPS_LOST``) for result.json.
A single job and a sweep's job (where a job with its restarts is one attempt of ``retry:N``) run the
one restart loop, :class:`ddlkit.launch.controller.JobController`, under the same policy. So does a
target that restarts a job's ranks in place, where they run, without a new submission
(``compute=ray``'s driver): it gets the policy with the job (:class:`~ddlkit.interfaces.RestartBudget`,
:meth:`RestartPolicy.from_budget`), says each restart with the same line, and reports the entries with
the job's end, which the launcher counts (:meth:`RestartPolicy.count_in_place`) and records.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..checkpoint import checkpoint_step, resolve_resume
from ..interfaces import JobState, JobStatus, RestartBudget
from ..jobdir import (
    EXIT_CONFIG_ERROR,
    EXIT_LOST_PEER,
    EXIT_OOM_KILLED,
    EXIT_PLUGIN_ERROR,
    EXIT_PREEMPTED,
    PROGRESS_PATTERN,
    rank_log,
)
from .process import split_tail

#: signals that come from outside a rank: a node lost or shut down, a VM preempted, a scheduler's kill
INFRASTRUCTURE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
#: the longest wait between restarts, however many came before
MAX_BACKOFF_S = 300.0

_PROGRESS = re.compile(PROGRESS_PATTERN, re.MULTILINE)


@dataclass(frozen=True)
class Verdict:
    """Whether an ended job is restarted, and why (one phrase, for the console and the record)."""

    restart: bool
    why: str


def classify(status: JobStatus) -> Verdict:
    """Whose failure ended the job: the infrastructure's (restart) or the job's own (do not)."""
    code = status.exit_code
    if status.state is JobState.CANCELLED:
        return Verdict(False, "the job was cancelled")
    if status.state is not JobState.FAILED:
        return Verdict(False, f"the job {status.state.value}")
    if code == EXIT_PREEMPTED:
        return Verdict(True, "its ranks were stopped on notice (a preemption) after a checkpoint")
    if code == EXIT_LOST_PEER:
        return Verdict(True, "a rank was lost (it left, went silent or never joined)")
    if code == EXIT_OOM_KILLED:
        return Verdict(False, "the kernel's out-of-memory killer ended a rank, and would again")
    if code is not None and (code < 0 or code > 128):
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if number in INFRASTRUCTURE_SIGNALS:
            return Verdict(True, f"a rank was killed by {name} from outside (a lost node, a preemption)")
        return Verdict(False, f"a rank crashed with {name}: a fault in the job's own (native) code")
    if code == EXIT_CONFIG_ERROR:
        return Verdict(False, "a config error, which the same command would meet again")
    if code == EXIT_PLUGIN_ERROR:
        return Verdict(False, "a plugin error, which the same command would meet again")
    return Verdict(False, f"an error in the job's own code or data (exit status {code})")


def step_reached(job_dir: Path) -> int | None:
    """The last optimizer step rank 0 reported (its progress lines in ``rank-0.log``)."""
    log = Path(job_dir) / rank_log(0)
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    steps = [int(m["step"]) for m in _PROGRESS.finditer(text[-1_000_000:])]
    return steps[-1] if steps else None


def resumes_from(job_dir: Path, resume: object) -> int:
    """The step a restart resumes from: the newest verified checkpoint's, as the ranks will choose it."""
    checkpoint = resolve_resume(Path(job_dir), resume, warn=lambda message: None)
    return (checkpoint_step(checkpoint) or 0) if checkpoint is not None else 0


@dataclass
class RestartPolicy:
    """The restarts one job may still have, and the record of those it had."""

    max_restarts: int
    backoff_s: float
    out: TextIO
    #: how long a restart waits for the nodes it needs (``restart.capacity_wait_s``; ddlkit.launch.elastic)
    capacity_wait_s: float = 0.0
    done: int = 0
    steps_lost: int = 0

    @classmethod
    def from_budget(cls, budget: RestartBudget, out: TextIO) -> RestartPolicy:
        """The policy a target applies in place, with the restarts the job has had so far."""
        return cls(budget.max_restarts, budget.backoff_s, out, done=budget.done, steps_lost=budget.steps_lost)

    def budget(self) -> RestartBudget:
        """What a target that restarts in place needs of this policy (:attr:`JobSpec.restart`)."""
        return RestartBudget(self.max_restarts, self.backoff_s, self.done, self.steps_lost)

    def count_in_place(self, status: JobStatus) -> None:
        """Count the restarts the target made in place (:attr:`JobStatus.restarts`) as this policy's own."""
        for entry in status.restarts:
            self.done += 1
            self.steps_lost += int(entry.get("steps_lost") or 0)

    def allows(self, verdict: Verdict) -> bool:
        return verdict.restart and self.done < self.max_restarts

    def why_not(self, verdict: Verdict) -> str:
        """What the failure message adds: why the job was not restarted."""
        if verdict.restart:
            return f"not restarted again: {self.done} of restart.max_restarts={self.max_restarts} restarts used"
        return f"not restarted: {verdict.why}"

    def plan_restart(
        self,
        verdict: Verdict,
        status: JobStatus,
        job_dir: Path,
        resume: object,
        *,
        prefix: str = "ddlkit: ",
        in_place: bool = False,
    ) -> dict[str, Any]:
        """Count, say and return the entry for the restart about to happen; its ``wait_s`` (the backoff)
        is the caller's to wait out -- a sweep waits without holding up its other jobs. ``prefix``
        names the job in the line said (a sweep's job number); a restart ``in_place`` (by the target,
        :class:`~ddlkit.interfaces.RestartBudget`) says so, and its entry records it."""
        reached = step_reached(job_dir)
        start = resumes_from(job_dir, resume)
        lost = max(0, (reached or start) - start)
        self.done += 1
        self.steps_lost += lost
        wait = min(self.backoff_s * 2 ** (self.done - 1), MAX_BACKOFF_S)
        at = f"at step {reached}" if reached is not None else "before its first step"
        how = " in place" if in_place else ""
        self.out.write(
            f"{prefix}restart {self.done}/{self.max_restarts}{how}: {verdict.why}; it ended {at} "
            f"({_first_line(status.message)}); resuming from step {start} in {wait:g} s\n"
        )
        self.out.flush()
        return {
            "time": time.time(),
            "cause": verdict.why,
            "exit_code": status.exit_code,
            "detail": _first_line(status.message),
            "step_reached": reached,
            "resumed_from": start,
            "steps_lost": lost,
            "wait_s": wait,
            **({"in_place": True} if in_place else {}),
        }


def _first_line(message: str) -> str:
    """The headline of a target's message about an end, without the log lines it goes on to quote."""
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else "no message"
    quoted = split_tail(line + "\n")
    return (quoted.headline if quoted else line).rstrip(":;")
