"""ddlkit.launch.controller.JobController: the one restart loop, one non-blocking step at a time, over a
target whose runs end as a list says (the first killed from outside, the next ones as given)."""

from __future__ import annotations

import io
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from ddlkit import ComputeTarget, JobHandle, JobSpec, JobState, JobStatus
from ddlkit.config import RestartConfig
from ddlkit.launch.controller import JobController, Restarts, policy_for, restart_config, restart_policy, submit
from ddlkit.launch.prepare import PreparedJob

KILLED = JobStatus(JobState.FAILED, -signal.SIGKILL, "rank 1 (node 1) failed first, with killed by signal SIGKILL")
OWN_ERROR = JobStatus(JobState.FAILED, 1, "rank 0 (node 0) failed first, with exit status 1")
DONE = JobStatus(JobState.SUCCEEDED, 0)


class Run(JobHandle):
    def __init__(self, number: int, status: JobStatus) -> None:
        self.id, self._status, self.cancelled = f"run-{number}", status, False

    def status(self) -> JobStatus:
        return self._status

    def logs(self, follow: bool = True) -> Iterator[str]:
        yield from ()

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self._status


class Runs(ComputeTarget):
    """Each submission is a run that has already ended as ``ends`` says, in turn."""

    def __init__(self, *ends: JobStatus) -> None:
        super().__init__(None)
        self.ends, self.runs = list(ends), []

    def submit(self, spec: JobSpec) -> JobHandle:
        status = self.ends[len(self.runs)]
        if status.state is JobState.SUCCEEDED:
            (spec.job_dir / "result.json").write_text(json.dumps({"steps": 1}))
        self.runs.append(Run(len(self.runs), status))
        return self.runs[-1]


def controlled(
    tmp_path: Path, target: Runs, backoff_s: float, max_restarts: int = 2
) -> tuple[JobController, io.StringIO]:
    restart = {"max_restarts": max_restarts, "backoff_s": backoff_s, "capacity_wait_s": 0}
    job = PreparedJob(
        JobSpec(name="2026-11-28_10-00-00-0badcafe", job_dir=tmp_path),
        target,
        redacted_config={"compute": {"name": "runs"}, "restart": restart, "trainer": {"resume": "auto"}},
        overrides=(),
    )
    out = io.StringIO()
    policy = restart_policy(job, out)
    return JobController(submit(job, budget=policy.budget()), tmp_path, Restarts(job, policy)), out


def test_a_step_never_waits_out_the_backoff(tmp_path: Path) -> None:
    target = Runs(KILLED, DONE)
    life, out = controlled(tmp_path, target, backoff_s=30)
    started = time.monotonic()
    status = life.step()
    assert time.monotonic() - started < 2, "a step blocked"
    assert status.state is JobState.RUNNING and status.message.startswith("restarting in "), status
    assert life.between_runs and 28 < life.next_step_in() <= 30
    assert "ddlkit: restart 1/2: a rank was killed by SIGKILL from outside" in out.getvalue()
    assert len(target.runs) == 1  # not resubmitted before the backoff is over


def test_the_backoff_over_a_step_resubmits_and_the_job_ends_with_its_new_run(tmp_path: Path) -> None:
    target = Runs(KILLED, DONE)
    life, _ = controlled(tmp_path, target, backoff_s=0.2)
    assert life.step().state is JobState.RUNNING
    time.sleep(life.next_step_in())
    status = life.step()
    assert [r.id for r in target.runs] == ["run-0", "run-1"] and life.id == "run-1"
    assert (life.step() if not status.state.done else status).state is JobState.SUCCEEDED
    assert life.why_not == "" and life.refused is None


def test_a_cancel_between_runs_ends_the_job_at_once_as_its_last_run_did(tmp_path: Path) -> None:
    target = Runs(KILLED, DONE)
    life, _ = controlled(tmp_path, target, backoff_s=30)
    life.step()
    life.cancel()
    assert life.step() == KILLED and not life.between_runs
    assert len(target.runs) == 1


def test_the_jobs_own_error_is_not_restarted_and_says_why(tmp_path: Path) -> None:
    target = Runs(OWN_ERROR)
    life, out = controlled(tmp_path, target, backoff_s=0)
    status = life.step()
    assert status == OWN_ERROR and "restart" not in out.getvalue()
    assert life.why_not == "not restarted: an error in the job's own code or data (exit status 1)"


def test_restarts_used_up_end_the_job_and_a_sweep_sees_why_on_its_first_line(tmp_path: Path) -> None:
    target = Runs(KILLED, KILLED)
    life, _ = controlled(tmp_path, target, backoff_s=0, max_restarts=1)
    life.annotate = True
    status = life.wait()
    assert len(target.runs) == 2 and status.exit_code == -signal.SIGKILL
    assert status.message.endswith("(not restarted again: 1 of restart.max_restarts=1 restarts used)"), status.message


def test_a_config_without_restart_options_takes_the_schemas_defaults_and_the_targets() -> None:
    """The restart options come typed by their schema (job.json's copy may lack keys a newer schema
    has); null max_restarts and capacity_wait_s mean the target's own defaults."""
    assert restart_config({}) == RestartConfig()
    policy = policy_for(restart_config({"backoff_s": 2}), Runs(), io.StringIO())
    assert (policy.max_restarts, policy.backoff_s, policy.capacity_wait_s) == (3, 2.0, 600.0)
    policy = policy_for(restart_config({"max_restarts": 0, "capacity_wait_s": 5}), Runs(), io.StringIO())
    assert (policy.max_restarts, policy.backoff_s, policy.capacity_wait_s) == (0, RestartConfig.backoff_s, 5)
