"""Whose failure ended a job (ddlkit.launch.restarts.classify): the infrastructure's is restarted,
the job's own never (the end-to-end restarts run on local_mpi: plugins/ddlkit-mpi/tests/test_restarts.py)."""

from __future__ import annotations

import io

import pytest

from ddlkit import JobState, JobStatus
from ddlkit.launch.restarts import RestartPolicy, classify


@pytest.mark.parametrize(("state", "code", "restart", "why"), [
    (JobState.FAILED, -9, True, "a rank was killed by SIGKILL from outside (a lost node, a preemption)"),
    (JobState.FAILED, 137, True, "a rank was killed by SIGKILL from outside (a lost node, a preemption)"),
    (JobState.FAILED, -15, True, "a rank was killed by SIGTERM from outside (a lost node, a preemption)"),
    (JobState.FAILED, 75, True, "its ranks were stopped on notice (a preemption) after a checkpoint"),
    (JobState.FAILED, 76, True, "a rank was lost (it left, went silent or never joined)"),
    (JobState.FAILED, 1, False, "an error in the job's own code or data (exit status 1)"),
    (JobState.FAILED, 2, False, "a config error, which the same command would meet again"),
    (JobState.FAILED, 3, False, "a plugin error, which the same command would meet again"),
    (JobState.FAILED, -11, False, "a rank crashed with SIGSEGV: a fault in the job's own (native) code"),
    (JobState.FAILED, 134, False, "a rank crashed with SIGABRT: a fault in the job's own (native) code"),
    (JobState.CANCELLED, -15, False, "the job was cancelled"),
    (JobState.SUCCEEDED, 0, False, "the job succeeded"),
])
def test_an_end_is_the_infrastructures_or_the_jobs_own(state: JobState, code: int, restart: bool, why: str) -> None:
    assert (classify(JobStatus(state, code)).restart, classify(JobStatus(state, code)).why) == (restart, why)


def test_the_policy_counts_its_restarts_and_says_why_it_stopped() -> None:
    policy = RestartPolicy(max_restarts=1, backoff_s=0, out=io.StringIO())
    lost, own = classify(JobStatus(JobState.FAILED, -9)), classify(JobStatus(JobState.FAILED, 1))
    assert policy.allows(lost) and not policy.allows(own)
    assert policy.why_not(own) == "not restarted: an error in the job's own code or data (exit status 1)"
    policy.done = 1
    assert not policy.allows(lost)
    assert policy.why_not(lost) == "not restarted again: 1 of restart.max_restarts=1 restarts used"
