"""``ddlkit --detach`` and ``ddlkit jobs``: submit without waiting, find the job again from any
shell (by name, prefix or directory), follow, attach, cancel; clear errors for bad references."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.launch import index
from ddlkit.launch.prepare import job_name
from ddlkit.testing import FAKES_MODULE, RunFactory, interruptible, wait_for

SMALL = (
    "data.image_size=8",
    "data.num_classes=4",
    "data.val_length=16",
    "trainer.batch_size=8",
    "trainer.epochs=1",
    "trainer.log_every=10",
)
#: about 10 s: long enough to be found, attached to and cancelled while it runs
SLOW = (*SMALL, "data.length=8000", "framework.step_delay_s=0.01")


def state(run_factory: RunFactory, ref: str) -> str:
    out = run_factory.cli("jobs", "status", ref).assert_success()
    return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("state:"))


@pytest.mark.slow
def test_detach_returns_at_once_and_the_job_is_found_followed_and_cancelled(run_factory: RunFactory) -> None:
    job_dir = run_factory.base_dir / "detached"
    t0 = time.monotonic()
    out = run_factory("--detach", *SLOW, job_dir=job_dir).assert_success()
    assert time.monotonic() - t0 < 10  # the job itself takes longer than that
    name = job_name(job_dir)
    assert f"ddlkit: detached; job {name} runs on compute=local" in out.stdout
    assert f"ddlkit jobs attach {name}" in out.stdout
    assert not (job_dir / "result.json").exists()

    listing = run_factory.cli("jobs", "list").assert_success().stdout
    row = next(line for line in listing.splitlines() if line.startswith(name))
    assert row.split()[1:3] == ["local", "running"] and row.endswith(str(job_dir))
    assert state(run_factory, name) == state(run_factory, str(job_dir)) == state(run_factory, name[:12]) == "running"

    wait_for(lambda: "step 10/" in (job_dir / "rank-0.log").read_text(), "the job to train")
    logs = run_factory.cli("jobs", "logs", name).assert_success().stdout
    assert logs.startswith("ddlkit: fake resnet18") and "step 10/1000" in logs

    cancel = run_factory.cli("jobs", "cancel", name).assert_success().stdout
    assert f"ddlkit: job {name} cancelled (exit status {EXIT_PREEMPTED}); resume with: ddlkit " in cancel
    assert (job_dir / "checkpoints" / "latest").is_file()
    assert state(run_factory, name) == "cancelled"
    again = run_factory.cli("jobs", "cancel", name).assert_success().stdout
    assert again == f"ddlkit: job {name} already ended (cancelled); nothing to cancel.\n"
    assert index.load(job_dir).state == "cancelled"


@pytest.mark.slow
def test_attach_follows_a_detached_job_to_its_result(run_factory: RunFactory) -> None:
    job_dir = run_factory.base_dir / "attached"
    run_factory("--detach", *SMALL, "data.length=800", "framework.step_delay_s=0.01", job_dir=job_dir).assert_success()
    out = run_factory.cli("jobs", "attach", str(job_dir)).assert_success().stdout
    # from the job's first line, as if it had never detached, to the launcher's last
    assert "ddlkit: fake resnet18" in out and "step 100/100" in out
    assert out.endswith(f"ddlkit: done; result in {job_dir}/result.json\n")
    assert index.load(job_dir).state == "succeeded"


@pytest.mark.slow
def test_a_job_run_in_the_foreground_is_found_from_another_shell(run_factory: RunFactory) -> None:
    job_dir = run_factory.base_dir / "foreground"
    env = {**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            *SMALL,
            "data.length=1600",
            "framework.step_delay_s=0.01",
            f"hydra.run.dir={job_dir}",
        ],
        cwd=run_factory.base_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    try:
        wait_for(lambda: (job_dir / index.SUBMISSION_FILE).is_file(), "the job's record", process=launcher)
        assert state(run_factory, job_name(job_dir)) == "running"
        followed = run_factory.cli("jobs", "logs", "--follow", str(job_dir)).assert_success().stdout
        assert "ddlkit run completed" in followed
        assert launcher.wait(timeout=30) == 0
    finally:
        launcher.kill()
    assert state(run_factory, str(job_dir)) == "succeeded"
    assert json.loads((job_dir / index.SUBMISSION_FILE).read_text())["state"] == "succeeded"


def test_a_job_of_another_host_or_without_an_exit_record_has_no_invented_end(run_factory: RunFactory) -> None:
    """Its status said "exit status -9 / killed by SIGKILL", its cancel "already ended (failed)" (issue 23, minor)."""
    job_dir = run_factory.base_dir / "job"
    run_factory("--detach", *SMALL, job_dir=job_dir).assert_success()
    wait_for(lambda: (job_dir / ".ddlkit" / "exit.json").is_file(), "the job to end")
    record = job_dir / ".ddlkit" / "submission.json"
    submission = json.loads(record.read_text())
    record.write_text(json.dumps({**submission, "host": "other-host"}))
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout
    assert (
        f"state:     unknown from this host: it runs as process {submission['id']} on host other-host; ask there\n"
    ) in status and "exit status" not in status, status
    cancel = run_factory.cli("jobs", "cancel", str(job_dir)).assert_returncode(2)
    assert cancel.stderr == (
        f"ddlkit: error: job {job_name(job_dir)} runs as process {submission['id']} on host "
        "other-host: its state is unknown from this host; cancel it there (ddlkit jobs cancel "
        f"{job_name(job_dir)}).\n"
    )
    # on its own host, with no exit record and no process left (the machine restarted)
    record.write_text(json.dumps(submission))
    (job_dir / ".ddlkit" / "exit.json").unlink()
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout
    assert "state:     failed\n" in status and "how it ended is unknown: no process of job" in status, status
    assert "exit status" not in status and "SIGKILL" not in status, status  # not the -9 it once invented


def test_an_ended_job_is_answered_from_its_record_once_its_target_cannot_attach(
    run_factory: RunFactory, tmp_path: Path
) -> None:
    """`ddlkit jobs status` of an ended job failed with the target's "cannot attach" once the target could no
    longer reach the job (issue 25, item 7). Its end is in its record, written after its files came back: the
    result in result.json, rank 0's output in rank-0.log; the target is not asked."""
    cluster = tmp_path / "cluster"
    remote = ("compute=elsewhere", f"compute.root={cluster}")
    done, failed = run_factory.base_dir / "done", run_factory.base_dir / "failed"
    run_factory(*SMALL, "data.length=64", *remote, job_dir=done).assert_success()
    run_factory(*SMALL, "data.length=64", "framework.fail_at_step=3", *remote, job_dir=failed).assert_returncode(1)
    shutil.rmtree(cluster)  # the cluster has forgotten both jobs: compute=elsewhere cannot attach to them

    status = run_factory.cli("jobs", "status", str(done)).assert_success().stdout
    assert "state:     succeeded\n" in status and f"job dir:   {done}\n" in status, status
    assert 'result:    {"steps": 8, ' in status, status
    logs = run_factory.cli("jobs", "logs", str(done)).assert_success().stdout
    assert logs == (done / "rank-0.log").read_text() and "ddlkit run completed" in logs
    attach = run_factory.cli("jobs", "attach", str(done)).assert_success().stdout
    assert attach.startswith(f"ddlkit: job {job_name(done)} has ended (succeeded); rank 0's output:\n{logs}"), attach
    assert attach.endswith(f"ddlkit: done; result in {done}/result.json\n"), attach
    cancel = run_factory.cli("jobs", "cancel", str(done)).assert_success().stdout
    assert cancel == f"ddlkit: job {job_name(done)} already ended (succeeded); nothing to cancel.\n"

    status = run_factory.cli("jobs", "status", str(failed)).assert_success().stdout
    assert "state:     failed (exit status 1)\n" in status and "fake framework failure at step 3" in status, status
    assert "result:" not in status
    attach = run_factory.cli("jobs", "attach", str(failed)).assert_returncode(1)
    assert "fake framework failure at step 3" in attach.stdout
    assert "job " + job_name(failed) + " failed" in attach.stderr


def test_an_unknown_job_is_named_with_the_recent_ones(run_factory: RunFactory) -> None:
    index.record("2026-11-23_10-00-00-0badcafe", run_factory.base_dir / "a", "local", "1")
    out = run_factory.cli("jobs", "status", "nosuchjob").assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: unknown job 'nosuchjob': not a job directory nor a recorded job name. "
        "Recent jobs: 2026-11-23_10-00-00-0badcafe (`ddlkit jobs list`).\n"
    )


def test_a_directory_that_is_no_job_is_refused(run_factory: RunFactory) -> None:
    plain = run_factory.base_dir / "plain"
    plain.mkdir()
    out = run_factory.cli("jobs", "logs", str(plain)).assert_returncode(2)
    assert out.stderr == f"ddlkit: error: {plain} is not a ddlkit job directory (it has no job.json).\n"


def test_detach_refuses_a_sweep(run_factory: RunFactory) -> None:
    out = run_factory.cli("--detach", "-m", "optimizer.lr=0.1,0.2").assert_returncode(2)
    assert out.stderr.startswith("ddlkit: error: --detach submits one job; a sweep's launcher schedules")


def test_an_unwritable_state_directory_leaves_a_run_unharmed_and_refuses_detach(run_factory: RunFactory) -> None:
    """Every run failed with an 85-line traceback (issue 23, item 5): a run trains, with one
    warning; --detach, whose job is found again through the index, is refused before anything."""
    not_a_dir = run_factory.base_dir / "state-file"
    not_a_dir.write_text("")
    env = {index.STATE_DIR_ENV: str(not_a_dir)}
    why = (
        f"the job index's directory {not_a_dir}/jobs ($DDLKIT_STATE_DIR) cannot be written (Not a directory): "
        "set DDLKIT_STATE_DIR to a writable directory"
    )
    job_dir = run_factory.base_dir / "unindexed"
    out = run_factory(*SMALL, "data.length=64", job_dir=job_dir, env=env).assert_success()
    assert out.stderr == (
        f"ddlkit: warning: {why}; until then `ddlkit jobs` finds jobs by their directory only "
        "(`ddlkit jobs status <job dir>`).\n"
    )
    assert state(run_factory, str(job_dir)) == "succeeded"
    detached = run_factory.base_dir / "detached"
    out = run_factory("--detach", *SMALL, job_dir=detached, env=env).assert_returncode(2)
    assert out.stderr == (
        f"ddlkit: error: --detach records the job in the job index, to find it again: {why}, or run without --detach.\n"
    )
    assert not detached.exists()


def test_list_with_no_jobs(run_factory: RunFactory) -> None:
    out = run_factory.cli("jobs", "list").assert_success()
    assert out.stdout == f"ddlkit: no jobs recorded yet (in {index.state_dir()}).\n"
