"""Whose failure ended a job (ddlkit.compute.restarts.classify): the infrastructure's is restarted,
the job's own never (the end-to-end restarts run on local_mpi: plugins/ddlkit-mpi/tests/test_restarts.py)."""

from __future__ import annotations

import io

import pytest

from ddlkit import JobState, JobStatus
from ddlkit.compute.restarts import RestartPolicy, classify


@pytest.mark.parametrize(
    ("state", "code", "restart", "why"),
    [
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
    ],
)
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


def test_a_target_restarts_in_place_under_the_launchers_policy_and_the_launcher_counts_them(tmp_path) -> None:
    """What a target that restarts in place (compute=ray's driver) gets with the job and gives back:
    the policy with the restarts used so far, the same line as the launcher's (saying 'in place'),
    and entries the launcher adds to its own count -- one allowance for the job, whoever restarts."""
    from ddlkit.launch import index

    launcher = RestartPolicy(max_restarts=3, backoff_s=2, out=io.StringIO(), done=1, steps_lost=4)
    out = io.StringIO()
    target = RestartPolicy.from_budget(launcher.budget(), out)
    (tmp_path / "rank-0.log").write_text("train epoch 1/2 step 7/16 loss 1.0 lr 0.1 img/s 10.0 eta 0:00:09\n")
    lost = JobStatus(JobState.FAILED, 137, "rank 1's node (1) was lost: ActorDiedError")
    entry = target.plan_restart(classify(lost), lost, tmp_path, "auto", in_place=True)
    assert out.getvalue() == (
        "ddlkit: restart 2/3 in place: a rank was killed by SIGKILL from outside (a lost node, "
        "a preemption); it ended at step 7 (rank 1's node (1) was lost: ActorDiedError); "
        "resuming from step 0 in 4 s\n"
    )  # the second restart: the backoff doubled
    assert (entry["in_place"], entry["steps_lost"], entry["step_reached"]) == (True, 7, 7)
    ended = JobStatus(JobState.SUCCEEDED, 0, restarts=(entry,))
    launcher.count_in_place(ended)
    assert (launcher.done, launcher.steps_lost) == (2, 11)
    # the job's record keeps it once, however often the end is seen (ddlkit jobs attach of an ended job)
    sub = index.record("2026-11-27_10-00-00-0badcafe", tmp_path, "ray", "raysubmit-1")
    sub.ended_with(ended)
    sub.ended_with(ended)
    (kept,) = index.load(tmp_path).restarts
    assert kept["in_place"] and kept["ended_id"] == "raysubmit-1", kept
