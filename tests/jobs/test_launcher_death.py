"""Nothing outlives its launcher by mistake, nothing is lost on a signal (issue 17, items 1-2):
SIGTERM to a sweep's launcher stops the sweep as Ctrl-C does; a launcher killed outright takes
its (not detached) job down with a checkpoint; a job directory refuses a second live writer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit import JobState
from ddlkit.jobdir import EXIT_FILE, EXIT_PREEMPTED
from ddlkit.launch import index
from ddlkit.launch.prepare import job_name
from ddlkit.plugins import get_plugin_manager
from ddlkit.rank.worker import hold_job_directory
from ddlkit.registry import Registry
from ddlkit.testing import FAKES_MODULE, RunFactory, interruptible, wait_for

SLOW = (
    "framework=fake",
    "data.image_size=8",
    "data.num_classes=4",
    "data.val_length=16",
    "trainer.batch_size=8",
    "trainer.epochs=1",
    "trainer.log_every=10",
    "data.length=8000",
    "framework.step_delay_s=0.01",
)


def launch(cwd: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}
    return subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )


def processes_in(directory: Path) -> list[int]:
    """Live processes whose working directory is below ``directory`` (a job's minder, worker)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cwd = os.readlink(Path(entry.path, "cwd"))
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cwd.startswith(str(directory.resolve())) and state != "Z":
                found.append(int(entry.name))
    return found


def training(job_dir: Path) -> bool:
    log = job_dir / "rank-0.log"
    return log.is_file() and "step 20/" in log.read_text()


@pytest.mark.slow
def test_sigterm_to_a_sweep_launcher_checkpoints_its_jobs_and_says_how_to_resume(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launcher = launch(tmp_path, "-m", *SLOW, "trainer.seed=1,2,3,4", f"hydra.sweep.dir={sweep}")
    try:
        wait_for(lambda: training(sweep / "0") and training(sweep / "1"), "two jobs to train", process=launcher)
        launcher.send_signal(signal.SIGTERM)
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert "ddlkit: sweep interrupted; its running jobs checkpointed and stopped." in stderr
    assert "resume with: ddlkit -m " in stderr
    jobs = json.loads((sweep / "ledger.json").read_text())["jobs"]
    assert [jobs[n]["status"] for n in ("0", "1", "2", "3")] == ["interrupted", "interrupted", "pending", "pending"]
    for num in ("0", "1"):
        assert (sweep / num / "checkpoints" / "latest").is_file()
    wait_for(lambda: not processes_in(sweep), "the jobs' processes to end", timeout=10)


@pytest.mark.slow
def test_a_killed_launcher_takes_its_job_down_with_a_checkpoint(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    launcher = launch(tmp_path, *SLOW, f"hydra.run.dir={job_dir}")
    try:
        wait_for(lambda: training(job_dir), "the job to train", process=launcher)
        launcher.send_signal(signal.SIGKILL)  # no handler, no atexit: only the minder can notice
        launcher.wait(timeout=10)
    finally:
        launcher.kill()
    wait_for(lambda: (job_dir / EXIT_FILE).is_file(), "the orphaned job to end", timeout=30)
    assert json.loads((job_dir / EXIT_FILE).read_text())["code"] == EXIT_PREEMPTED
    assert (
        "the launcher of this job is gone; asking the job to checkpoint and stop"
        in (job_dir / "rank-0.log").read_text()
    )
    assert (job_dir / "checkpoints" / "latest").is_file()
    wait_for(lambda: not processes_in(job_dir), "the job's processes to end", timeout=10)
    status = index.load(job_dir).handle(Registry.collect(get_plugin_manager())).status()
    assert status.state is JobState.CANCELLED, status


@pytest.mark.slow
@pytest.mark.parametrize("target", ["id", "group"])
def test_a_detached_job_dies_with_its_killed_id(run_factory: RunFactory, target: str) -> None:
    """``kill -9`` of the id ``--detach`` printed (or of its process group) leaves no worker
    training on unseen (issue 23, item 1): the minder's guard kills the job's session, records
    the end, and ``ddlkit jobs`` then sees a failed job that can be run again."""
    job_dir = run_factory.base_dir / "killed"
    out = run_factory("--detach", *SLOW[1:], job_dir=job_dir).assert_success()
    job_id = int(out.stdout.split(" runs on compute=local as ")[1].split(".")[0])
    wait_for(lambda: training(job_dir), "the job to train")
    os.kill(job_id if target == "id" else -job_id, signal.SIGKILL)
    wait_for(lambda: not processes_in(job_dir), "the job's processes to end", timeout=10)
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout
    assert "state:     failed (exit status -9)" in status
    assert f"ddlkit: this job's minder (id {job_id}) was killed; killing the job's processes" in status
    cancel = run_factory.cli("jobs", "cancel", str(job_dir)).assert_success().stdout
    assert cancel.endswith("already ended (failed); nothing to cancel.\n")
    assert index.load(job_dir).handle(Registry.collect(get_plugin_manager())).status().state is JobState.FAILED


@pytest.mark.slow
def test_a_job_directory_refuses_a_second_live_run(run_factory: RunFactory) -> None:
    job_dir = run_factory.base_dir / "busy"
    run_factory("--detach", *SLOW[1:], job_dir=job_dir).assert_success()
    try:
        again = run_factory(*SLOW[1:], job_dir=job_dir).assert_returncode(2)
        name = job_name(job_dir)
        assert again.stderr.startswith(f"ddlkit: error: job {name} still runs in {job_dir} (compute=local, id ")
        assert f"`ddlkit jobs cancel {name}`" in again.stderr
        assert not (job_dir / "result.json").exists()
    finally:
        run_factory.cli("jobs", "cancel", str(job_dir)).assert_success()


def test_the_worker_refuses_a_job_directory_another_process_holds(run_factory: RunFactory) -> None:
    """The last line of defence (two launchers racing, or a job nobody recorded): rank 0 locks
    the directory for the run; the kernel releases the lock on any exit."""
    job_dir = run_factory.base_dir / "locked"
    run_factory(
        "data.length=64", "data.val_length=16", "trainer.batch_size=8", "trainer.epochs=1", job_dir=job_dir
    ).assert_success()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from ddlkit.rank.worker import hold_job_directory; "
            f"lock = hold_job_directory(Path({str(job_dir)!r})); print('held', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        proc = subprocess.run(
            [sys.executable, "-m", "ddlkit.rank.worker", "job.json"],
            cwd=job_dir,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
        )
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr
    assert (f"ConfigError: {job_dir} is in use by another run of a job (pid {holder.pid} on ") in proc.stderr
    # the holder died (SIGKILL): the directory is free again at once
    hold_job_directory(job_dir).close()
