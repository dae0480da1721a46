"""The restart policy on compute=local_mpi (issue 27): real ranks under mpirun, a rank killed with
SIGKILL (a lost node), a user exception, restarts used up. Nothing may be lost: the restarted job
ends with the weights of a job that never failed, its final checkpoint verifies, its steps add up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.checkpoint import latest_checkpoint, verify
from ddlkit.testing.fakes import MODEL_FILE

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun")]

# 2 ranks, 16 steps (2 epochs of 8), a checkpoint every 4 steps
JOB = ("framework=fake", "compute=local_mpi", "compute.procs_per_node=2", "dist=native", "data.image_size=8",
       "data.num_classes=4", "data.length=256", "data.val_length=32", "trainer.batch_size=16", "trainer.epochs=2",
       "trainer.log_every=1", "trainer.checkpoint_every=4", "trainer.deterministic=true", "restart.backoff_s=0")


def ddlkit(tmp_path: Path, job: str, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    return subprocess.run([sys.executable, "-m", "ddlkit", *JOB, *overrides, f"hydra.run.dir={tmp_path / job}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def record(job_dir: Path) -> dict:
    return json.loads((job_dir / ".ddlkit" / "submission.json").read_text())


def test_a_killed_rank_restarts_the_job_which_ends_as_if_nothing_happened(tmp_path: Path) -> None:
    straight = ddlkit(tmp_path, "straight")
    assert straight.returncode == 0, straight.stderr
    killed = ddlkit(tmp_path, "killed", "framework.kill_at_step=7", "framework.kill_rank=1")
    assert killed.returncode == 0, killed.stdout[-3000:] + killed.stderr[-3000:]
    # rank 1 died before step 7 ended: step 6 was the last one rank 0 reported, step 4 the last checkpoint
    assert ("ddlkit: restart 1/3: a rank was killed by SIGKILL from outside (a lost node, a preemption); it ended at "
            "step 6 (rank 1 (node 0) failed first, with killed by signal SIGKILL); resuming from step 4 in 0 s\n"
            ) in killed.stdout
    job_dir = tmp_path / "killed"
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["steps_lost"], result["resumed_from_step"]) == (16, 1, 2, 4)
    # nothing lost: the weights of the job that never failed, a final checkpoint that verifies
    assert (job_dir / MODEL_FILE).read_bytes() == (tmp_path / "straight" / MODEL_FILE).read_bytes()
    assert verify(latest_checkpoint(job_dir)) is None
    [entry] = record(job_dir)["restarts"]
    assert (entry["step_reached"], entry["resumed_from"], entry["steps_lost"], entry["exit_code"]) == (6, 4, 2, -9)
    assert record(job_dir)["state"] == "succeeded"


def test_an_error_in_the_jobs_own_code_is_not_restarted(tmp_path: Path) -> None:
    failed = ddlkit(tmp_path, "failed", "framework.fail_at_step=3")
    assert failed.returncode == 1
    assert "ddlkit: restart" not in failed.stdout
    assert (" failed (not restarted: an error in the job's own code or data (exit status 1)): rank "
            in failed.stderr), failed.stderr
    assert record(tmp_path / "failed")["restarts"] == []


def test_restarts_used_up_end_the_job_and_say_so(tmp_path: Path) -> None:
    failed = ddlkit(tmp_path, "lost", "framework.kill_at_step=6", "framework.kill_rank=1",
                    "framework.kill_every_run=true", "restart.max_restarts=1")
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
        [sys.executable, "-m", "ddlkit", "-m", *JOB, "framework.kill_at_step=7", "framework.kill_rank=1",
         "framework.kill_every_run=false,true", "restart.max_restarts=1", "sweep.on_failure=retry:1",
         "sweep.max_parallel=1", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("ddlkit: sweep job #0 restart 1/1: a rank was killed by SIGKILL") == 1, out
    assert out.count("ddlkit: sweep job #1 restart 1/1: a rank was killed by SIGKILL") == 2, out
    assert "ddlkit: sweep job #0 completed in " in out and " (1 restart, 2 steps lost): " in out
    assert "(not restarted again: 1 of restart.max_restarts=1 restarts used)" in out
    assert "retrying it (retry 1 of 1)" in out
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    assert [(j["status"], j["attempts"], j["restarts"]) for j in jobs.values()] == [
        ("completed", 1, 1), ("failed", 2, 2)]
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
