"""The restart policy on compute=local_mpi (issue 27): real ranks under mpirun and real signals -- a
rank killed with SIGKILL (a lost node), a rank stopped (SIGSTOP) past dist.timeout_s, a preemption
notice (SIGTERM, then SIGKILL after the grace), a rank killed while writing a checkpoint -- and the
ends that are not restarted: a user exception, a NaN loss, restarts used up. Nothing may be lost: a
restarted job ends with the weights of a job that never failed, its final checkpoint verifies, its
steps add up."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlkit.testing import alive, wait_for
from ddlkit.testing.core import checkpoint_step, latest_checkpoint, verify
from ddlkit.testing.fakes import MODEL_FILE
from ddlkit.testing.multirank import read_lines_until, worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun")]

# 2 ranks, 16 steps (2 epochs of 8), a checkpoint every 4 steps
JOB = (
    "framework=fake",
    "compute=local_mpi",
    "compute.procs_per_node=2",
    "dist=native",
    "data.image_size=8",
    "data.num_classes=4",
    "data.length=256",
    "data.val_length=32",
    "trainer.batch_size=16",
    "trainer.epochs=2",
    "trainer.log_every=1",
    "trainer.checkpoint_every=4",
    "trainer.deterministic=true",
    "restart.backoff_s=0",
)


def ddlkit(tmp_path: Path, job: str, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *JOB, *overrides, f"hydra.run.dir={tmp_path / job}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def record(job_dir: Path) -> dict:
    return json.loads((job_dir / ".ddlkit" / "submission.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The trained weights of the job run without a failure."""
    base = tmp_path_factory.mktemp("straight")
    done = ddlkit(base, "straight")
    assert done.returncode == 0, done.stderr
    return (base / "straight" / MODEL_FILE).read_bytes()


def ended_as_if_nothing_happened(job_dir: Path, straight: bytes, *, restarts: int = 1) -> list[dict]:
    """The checks every restarted job passes: the weights of the job that never failed, a final
    checkpoint that verifies, 16 steps, and the lost steps of the record's restarts adding up to
    result.json's. Returns the record's restarts."""
    result = json.loads((job_dir / "result.json").read_text())
    entries = record(job_dir)["restarts"]
    assert (result["steps"], result["restarts"], len(entries)) == (16, restarts, restarts), result
    assert all(e["steps_lost"] == e["step_reached"] - e["resumed_from"] for e in entries), entries
    assert result["steps_lost"] == sum(e["steps_lost"] for e in entries)
    assert result["resumed_from_step"] == entries[-1]["resumed_from"]
    assert (job_dir / MODEL_FILE).read_bytes() == straight
    assert verify(latest_checkpoint(job_dir)) is None
    assert record(job_dir)["state"] == "succeeded"
    return entries


def start(tmp_path: Path, job: str, *overrides: str) -> subprocess.Popen:
    """A launcher in the background whose steps last long enough to signal its ranks mid-job."""
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            *JOB,
            "framework.step_delay_s=0.4",
            *overrides,
            f"hydra.run.dir={tmp_path / job}",
        ],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def at_step(launcher: subprocess.Popen, job_dir: Path, step: int) -> dict[int, int]:
    """Once rank 0 has reported ``step``: {rank: pid} of the job's workers."""
    log = job_dir / "rank-0.log"
    wait_for(
        lambda: log.is_file() and f"step {step}/" in log.read_text(),
        f"the job to reach step {step}",
        timeout=120,
        pace=0.1,
        process=launcher,
    )
    pids = worker_pids(job_dir)
    assert sorted(pids) == [0, 1], pids
    return pids


def test_a_killed_rank_restarts_the_job_which_ends_as_if_nothing_happened(tmp_path: Path, straight: bytes) -> None:
    killed = ddlkit(tmp_path, "killed", "framework.kill_at_step=7", "framework.kill_rank=1")
    assert killed.returncode == 0, killed.stdout[-3000:] + killed.stderr[-3000:]
    # rank 1 died before step 7 ended: step 6 was the last one rank 0 reported, step 4 the last checkpoint
    assert (
        "ddlkit: restart 1/3: a rank was killed by SIGKILL from outside (a lost node, a preemption); it ended at "
        "step 6 (rank 1 (node 0) failed first, with killed by signal SIGKILL); resuming from step 4 in 0 s\n"
    ) in killed.stdout
    job_dir = tmp_path / "killed"
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["steps_lost"], result["resumed_from_step"]) == (16, 1, 2, 4)
    [entry] = ended_as_if_nothing_happened(job_dir, straight)
    assert (entry["step_reached"], entry["resumed_from"], entry["steps_lost"], entry["exit_code"]) == (6, 4, 2, -9)
    # the resubmission in the job's record, as `ddlkit jobs status` shows it
    assert entry["ended_id"] and entry["ended_id"] != record(job_dir)["id"]
    status = subprocess.run(
        [sys.executable, "-m", "ddlkit", "jobs", "status", str(job_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    assert re.search(
        r"^restart 1: \S+ \S+: a rank was killed by SIGKILL from outside \(a lost node, a preemption\); "
        rf"it ended at step 6 as {entry['ended_id']} \(rank 1 \(node 0\) failed first, with killed by "
        r"signal SIGKILL\); resubmitted, resuming from step 4 \(2 steps lost\)$",
        status.stdout,
        re.M,
    ), status.stdout


def test_a_rank_stopped_past_the_dist_timeout_restarts_the_job(tmp_path: Path, straight: bytes) -> None:
    """SIGSTOP to rank 1 (a hung node): rank 0 waits dist.timeout_s for it in a collective, then
    stops with EXIT_LOST_PEER (76); the job restarts, and the stopped rank is gone."""
    job_dir = tmp_path / "stopped"
    launcher = start(tmp_path, "stopped", "dist.timeout_s=4", "dist.warn_after_s=1")
    try:
        pids = at_step(launcher, job_dir, 6)
        os.kill(pids[1], signal.SIGSTOP)
        stdout, stderr = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "ddlkit: restart 1/3: a rank was lost (it left, went silent or never joined); it ended at step " in stdout
    [entry] = ended_as_if_nothing_happened(job_dir, straight)
    assert entry["exit_code"] == 76 and entry["detail"].startswith("rank 1 stopped answering first"), entry
    assert entry["resumed_from"] in (4, 8, 12) and entry["step_reached"] >= 6
    assert not alive(pids[1])  # mpirun ended the stopped rank with its job


def test_a_preemption_notice_restarts_the_job_with_no_step_lost(tmp_path: Path, straight: bytes) -> None:
    """A preempted VM: SIGTERM to every rank (the notice), SIGKILL to whatever still runs after the
    grace. The ranks checkpoint at the step they agree on and stop (EXIT_PREEMPTED): the job
    restarts from that checkpoint and loses no step."""
    job_dir = tmp_path / "preempted"
    launcher = start(tmp_path, "preempted")
    try:
        pids = at_step(launcher, job_dir, 6)
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
        grace = time.monotonic() + 10
        while time.monotonic() < grace and any(alive(pid) for pid in pids.values()):
            time.sleep(0.1)
        for pid in pids.values():  # the VM goes away after the grace, with whatever still runs on it
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "ddlkit: restart 1/3: its ranks were stopped on notice (a preemption) after a checkpoint; " in stdout
    [entry] = ended_as_if_nothing_happened(job_dir, straight)
    assert entry["exit_code"] == 75 and entry["steps_lost"] == 0 and entry["resumed_from"] >= 6, entry
    assert json.loads((job_dir / "result.json").read_text())["steps_lost"] == 0


def test_a_rank_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(
    tmp_path: Path, straight: bytes
) -> None:
    """Rank 0 dies halfway through writing the checkpoint of step 8: the half-written file is never
    taken for a checkpoint; the restart resumes from step 4's, the last verified one. The write
    runs in the background (trainer.checkpoint_async): the ranks may have trained a step or two
    more when it dies."""
    killed = ddlkit(tmp_path, "saving", "framework.kill_while_saving_at_step=8")
    assert killed.returncode == 0, killed.stdout[-3000:] + killed.stderr[-3000:]
    ended = re.search(
        r"ddlkit: restart 1/3: a rank was killed by SIGKILL from outside \(a lost node, a preemption\); "
        r"it ended at step (\d+) \(rank 0 \(node 0\) failed first",
        killed.stdout,
    )
    assert ended and int(ended[1]) >= 8, killed.stdout
    assert "resuming from step 4 in 0 s" in killed.stdout
    [entry] = ended_as_if_nothing_happened(tmp_path / "saving", straight)
    assert (entry["step_reached"], entry["resumed_from"], entry["steps_lost"]) == (int(ended[1]), 4, int(ended[1]) - 4)


def test_a_nan_loss_is_not_restarted_and_the_error_says_why(tmp_path: Path) -> None:
    """A diverged run would diverge again: no restart; the error names the step and the fix, and the
    checkpoint before it still verifies."""
    failed = ddlkit(tmp_path, "nan", "framework.nan_at_step=7")
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    assert "ddlkit: restart" not in failed.stdout
    assert " failed (not restarted: an error in the job's own code or data (exit status 1)): " in failed.stderr
    assert "loss became nan at step 7: training diverged. Lower optimizer.lr" in failed.stderr, failed.stderr
    assert record(tmp_path / "nan")["restarts"] == []
    checkpoint = latest_checkpoint(tmp_path / "nan")
    assert checkpoint is not None and checkpoint_step(checkpoint) == 4 and verify(checkpoint) is None


def test_an_error_in_the_jobs_own_code_is_not_restarted(tmp_path: Path) -> None:
    failed = ddlkit(tmp_path, "failed", "framework.fail_at_step=3")
    assert failed.returncode == 1
    assert "ddlkit: restart" not in failed.stdout
    assert " failed (not restarted: an error in the job's own code or data (exit status 1)): rank " in failed.stderr, (
        failed.stderr
    )
    assert record(tmp_path / "failed")["restarts"] == []


def test_restarts_used_up_end_the_job_and_say_so(tmp_path: Path) -> None:
    failed = ddlkit(
        tmp_path,
        "lost",
        "framework.kill_at_step=6",
        "framework.kill_rank=1",
        "framework.kill_every_run=true",
        "restart.max_restarts=1",
    )
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.count("ddlkit: restart 1/1: a rank was killed by SIGKILL") == 1
    assert " failed (not restarted again: 1 of restart.max_restarts=1 restarts used): " in failed.stderr
    assert "resume with: " in failed.stderr  # from its checkpoint at step 4
    [entry] = record(tmp_path / "lost")["restarts"]
    assert (entry["step_reached"], entry["resumed_from"]) == (5, 4)


def test_a_sweeps_jobs_restart_as_single_jobs_do_and_retries_count_apart(tmp_path: Path) -> None:
    """Job #0 loses rank 1 once: restarted, it completes in its first attempt. Job #1 loses it on
    every run: restarted once (restart.max_restarts=1), it fails, counts once against
    sweep.on_failure=retry:1, and its retry restarts once and fails again. The ledger and the report
    keep the sweep's attempts and the target's restarts apart."""
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "-m",
            *JOB,
            "framework.kill_at_step=7",
            "framework.kill_rank=1",
            "framework.kill_every_run=false,true",
            "restart.max_restarts=1",
            "sweep.on_failure=retry:1",
            "sweep.max_parallel=1",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("ddlkit: sweep job #0 restart 1/1: a rank was killed by SIGKILL") == 1, out
    assert out.count("ddlkit: sweep job #1 restart 1/1: a rank was killed by SIGKILL") == 2, out
    assert "ddlkit: sweep job #0 completed in " in out and " (1 restart, 2 steps lost): " in out
    assert "(not restarted again: 1 of restart.max_restarts=1 restarts used)" in out
    assert "retrying it (retry 1 of 1)" in out
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    assert [(j["status"], j["attempts"], j["restarts"]) for j in jobs.values()] == [
        ("completed", 1, 1),
        ("failed", 2, 2),
    ]
    assert jobs["0"]["steps_lost"] == 2
    # job #0: the weights and steps of a job that never failed, its final checkpoint verified
    result = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["steps_lost"], result["resumed_from_step"]) == (16, 1, 2, 4)
    assert verify(latest_checkpoint(sweep_dir / "0")) is None
    assert [e["resumed_from"] for e in record(sweep_dir / "0")["restarts"]] == [4]
    # job #1: the record is its latest submission's (the retry's), with that attempt's restart
    assert [(e["step_reached"], e["resumed_from"]) for e in record(sweep_dir / "1")["restarts"]] == [(6, 4)]
    assert verify(latest_checkpoint(sweep_dir / "1")) is None
    assert "| job | overrides | status | attempts | restarts |" in (sweep_dir / "report.md").read_text()


def test_a_halving_sweep_promotes_a_two_rank_trial_by_resuming_it(tmp_path: Path, straight: bytes) -> None:
    """sweep.early_stopping=asha on local_mpi (2 ranks a trial; rungs at 1 of 2 epochs, the better half
    by training loss goes on): the promoted trial's second segment resumes its checkpoint and ends
    with the weights of the same job run straight through."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "-m",
            *JOB,
            "optimizer.lr=0.1,0.001",
            "sweep.early_stopping.scheduler=asha",
            "sweep.early_stopping.metric=loss",
            "sweep.early_stopping.reduction_factor=2",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env={**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    assert [j["status"] for j in jobs.values()] == ["completed", "paused"], proc.stdout
    assert [(s["from"], s["to"]) for s in jobs["0"]["segments"]] == [(0, 1), (1, 2)]
    assert json.loads((sweep_dir / "0" / "result.json").read_text())["resumed_from_step"] == 8
    assert (sweep_dir / "0" / MODEL_FILE).read_bytes() == straight


def test_a_detached_job_heals_its_killed_rank_without_a_launcher(tmp_path: Path, straight: bytes) -> None:
    """`ddlkit --detach` returns at once; the job's minder (ddlkit.launch.minder) drives the same
    controller as a followed job: rank 1 killed at step 7 is restarted under the same policy, and the job
    ends as if nothing happened. The prepared job it was handed (it holds the job's secrets) is gone."""
    launched = ddlkit(tmp_path, "detached", "--detach", "framework.kill_at_step=7", "framework.kill_rank=1")
    assert launched.returncode == 0, launched.stderr
    job_dir = tmp_path / "detached"
    assert f"its minder restarts it (log: {job_dir / '.ddlkit' / 'minder.log'})" in launched.stdout
    wait_for(lambda: record(job_dir).get("state") == "succeeded", "the detached job to end", timeout=240, pace=0.5)
    ended_as_if_nothing_happened(job_dir, straight)
    said = (job_dir / ".ddlkit" / "minder.log").read_text()
    assert "ddlkit: restart 1/3: a rank was killed by SIGKILL from outside" in said, said
    assert not (job_dir / ".ddlkit" / "minder.job").exists()


@pytest.mark.parametrize("stop", [signal.SIGTERM], ids=["SIGTERM"])
def test_a_stop_during_the_backoff_before_a_restart_says_where_the_job_stands(tmp_path: Path, stop: int) -> None:
    """A SIGTERM (or Ctrl-C) to the launcher while a restart waits out its backoff: nothing runs, so the
    job stops there -- one line naming its checkpoint and the resume command, exit 75 (issue 37, item 8;
    a SIGTERM used to kill the launcher with exit 143 and no word)."""
    launcher = start(tmp_path, "stopped", "framework.kill_at_step=7", "framework.kill_rank=1", "restart.backoff_s=120")
    read_lines_until(launcher, "ddlkit: restart 1/3", timeout=120)
    launcher.send_signal(stop)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 75, err
    assert (
        "stopped before its restart (1 of restart.max_restarts=3 restarts used), with its checkpoint "
        "step-00000004.ckpt; resume with: ddlkit "
    ) in err, err
    assert "Traceback" not in err


def test_a_term_to_the_jobs_id_is_a_stop_that_is_not_restarted(tmp_path: Path) -> None:
    """`kill -TERM <id>` (the id --detach printed: the job's minder) is someone stopping the job: its
    ranks checkpoint and stop, and its end is a cancel, which the detached job's minder does not restart
    (issue 37, item 7: it was taken for a pre-emption, and the job restarted and ran to its end)."""
    launched = ddlkit(tmp_path, "termed", "--detach", "framework.step_delay_s=0.4")
    assert launched.returncode == 0, launched.stderr
    job_id = int(launched.stdout.split(" runs on compute=local_mpi as ")[1].split(";")[0])
    job_dir = tmp_path / "termed"
    log = job_dir / "rank-0.log"
    wait_for(lambda: log.is_file() and "step 5/" in log.read_text(), "the job to reach step 5", timeout=120)
    os.kill(job_id, signal.SIGTERM)
    wait_for(lambda: record(job_dir).get("state") == "cancelled", "the job to end cancelled", timeout=120, pace=0.5)
    assert (
        record(job_dir)["restarts"] == [] and "ddlkit: restart" not in (job_dir / ".ddlkit" / "minder.log").read_text()
    )
    assert verify(latest_checkpoint(job_dir)) is None and checkpoint_step(latest_checkpoint(job_dir)) >= 5
