"""A job runs somewhere else: compute=elsewhere copies the job directory away, moves the
launcher's copy out of reach, runs the job in a bare environment, and brings the files back.
A full training run, a resume and a sweep must work on it exactly as on compute=local."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit import ComputeTarget
from ddlkit.launch.prepare import job_name
from ddlkit.testing import FAKES_MODULE, RunFactory, interruptible, wait_for
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit.testing.elsewhere import ElsewhereComputeConfig, ElsewhereTarget
from ddlkit.testing.fakes import MODEL_FILE

COMMON = (
    "data.image_size=8",
    "data.num_classes=4",
    "data.length=64",
    "data.val_length=16",
    "trainer.batch_size=8",
    "trainer.epochs=2",
    "trainer.log_every=2",
    "trainer.deterministic=true",
)


class TestElsewhereTarget(ComputeTargetContract):
    @pytest.fixture
    def target(self, tmp_path: Path) -> ComputeTarget:
        return ElsewhereTarget(
            ElsewhereComputeConfig(root=str(tmp_path / "cluster"), poll_interval_s=0.05, grace_period_s=5.0)
        )


def elsewhere(tmp_path: Path) -> tuple[str, str]:
    return "compute=elsewhere", f"compute.root={tmp_path / 'cluster'}"


@pytest.mark.slow
def test_a_run_elsewhere_ends_with_the_weights_of_a_local_run(run_factory: RunFactory, tmp_path: Path) -> None:
    local = run_factory(*COMMON).assert_success()
    remote = run_factory(*COMMON, *elsewhere(tmp_path)).assert_success()
    assert (remote.job_dir / MODEL_FILE).read_bytes() == (local.job_dir / MODEL_FILE).read_bytes()
    for key in ("steps", "final_loss", "top1", "top5", "val_loss", "best_top1"):
        assert remote.result[key] == local.result[key], key
    assert [m.get("loss") for m in remote.metrics] == [m.get("loss") for m in local.metrics]
    # it really ran on the other copy, which names no path of the launcher's
    cluster_copy = tmp_path / "cluster" / job_name(remote.job_dir)
    assert (cluster_copy / "result.json").is_file() and (remote.job_dir / "rank-0.log").is_file()
    assert str(remote.job_dir) not in (remote.job_dir / "job.json").read_text()
    assert not remote.job_dir.with_name(remote.job_dir.name + ".away").exists()


@pytest.mark.slow
def test_a_run_elsewhere_resumes_from_the_checkpoints_on_the_other_side(
    run_factory: RunFactory, tmp_path: Path
) -> None:
    straight = run_factory(*COMMON).assert_success()
    job_dir = tmp_path / "resumed"
    run_factory(*COMMON, *elsewhere(tmp_path), "trainer.max_steps=3", job_dir=job_dir).assert_success()
    resumed = run_factory(*COMMON, *elsewhere(tmp_path), job_dir=job_dir).assert_success()
    assert resumed.result["resumed_from_step"] == 3
    assert (resumed.job_dir / MODEL_FILE).read_bytes() == (straight.job_dir / MODEL_FILE).read_bytes()


@pytest.mark.slow
def test_a_sweep_runs_elsewhere(run_factory: RunFactory, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    run_factory.cli(
        "-m", *COMMON, *elsewhere(tmp_path), "optimizer.lr=0.1,0.2", f"hydra.sweep.dir={sweep}"
    ).assert_success()
    ledger = json.loads((sweep / "ledger.json").read_text())["jobs"]
    for num in ("0", "1"):
        job = ledger[num]
        assert job["status"] == "completed" and job["attempts"] == 1
        assert job["handle"].startswith(f"{job_name(sweep / num)}/")
        assert json.loads((sweep / num / "result.json").read_text())["steps"] == 16
        assert job["log"] == str(sweep / num / "rank-0.log")


@pytest.mark.slow
def test_a_rerun_sweep_reattaches_to_jobs_its_killed_launcher_left_running(
    run_factory: RunFactory, tmp_path: Path
) -> None:
    """The launcher dies (SIGKILL: no cleanup at all); its jobs on the cluster run on. Running the
    sweep again re-attaches to them instead of submitting them a second time."""
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "framework=fake",
        *COMMON,
        *elsewhere(tmp_path),
        "data.length=3000",
        "framework.step_delay_s=0.01",
        "optimizer.lr=0.1,0.2",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args],
        cwd=tmp_path,
        env=env,
        stdout=open(tmp_path / "launcher.log", "w"),
        stderr=subprocess.STDOUT,
        preexec_fn=interruptible,
    )
    ledger = sweep / "ledger.json"

    def both_running() -> bool:
        jobs = json.loads(ledger.read_text())["jobs"] if ledger.is_file() else {}
        return len(jobs) == 2 and all(j["status"] == "running" and j["handle"] for j in jobs.values())

    try:
        wait_for(
            both_running,
            "the sweep's two jobs to start",
            process=launcher,
            detail=lambda: (tmp_path / "launcher.log").read_text(),
        )
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()

    out = run_factory.cli(*args, timeout=120).assert_success()
    assert out.stdout.count("still running: re-attached") == 2, out.output
    jobs = json.loads(ledger.read_text())["jobs"]
    for num in ("0", "1"):
        assert (jobs[num]["status"], jobs[num]["attempts"]) == ("completed", 1)
        log = (sweep / num / "rank-0.log").read_text()
        assert log.count("ddlkit: fake") == 1, "the job was submitted twice"
        assert json.loads((sweep / num / "result.json").read_text())["resumed_from_step"] is None


def test_a_rank_started_outside_its_job_directory_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit.rank.worker", "job.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"ddlkit worker: cannot read the job file {tmp_path}/job.json (")
    assert "Traceback" not in proc.stderr


def test_a_rank_needs_no_plugin_of_the_target_it_runs_in(run_factory: RunFactory, tmp_path: Path) -> None:
    """A rank never builds its compute target: the job file's compute options stay as they are
    where the target's plugin is not installed (an image built without it), and the job trains."""
    job_dir = run_factory(*COMMON, "trainer.epochs=1").assert_success().job_dir
    job = json.loads((job_dir / "job.json").read_text())
    job["config"]["compute"] = {"name": "somewhere", "nodes": 2, "queue": "gpu"}  # no installed plugin has it
    (job_dir / "job.json").write_text(json.dumps(job))
    (job_dir / "result.json").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit.rank.worker", "job.json"],
        cwd=job_dir,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((job_dir / "result.json").read_text())["status"] == "completed"


NEEDS = ("framework.needs=[ddlkit_no_such_module]",)
NEEDS_MESSAGE = (
    "framework=fake needs ddlkit_no_such_module, which this environment lacks: install it where the ranks run."
)


def test_what_the_ranks_need_is_required_here_when_they_run_here(run_factory: RunFactory) -> None:
    """compute=local runs the ranks with this environment: its lack is one line before anything runs."""
    outcome = run_factory(*COMMON, *NEEDS).assert_returncode(2)
    assert outcome.stderr.strip().splitlines() == [f"ddlkit: error: {NEEDS_MESSAGE}"]
    assert not (outcome.job_dir / "job.json").exists()


@pytest.mark.slow
def test_what_the_ranks_need_is_not_required_of_a_launcher_whose_target_runs_them_elsewhere(
    run_factory: RunFactory, tmp_path: Path
) -> None:
    """A laptop plans and submits a job whose ranks run in their own environment (an image, another
    interpreter); the plan says what they need, and a rank that lacks it fails at once, in one line."""
    plan = run_factory.cli(
        "plan", "framework=fake", *COMMON, *NEEDS, *elsewhere(tmp_path), f"hydra.run.dir={tmp_path / 'planned'}"
    ).assert_success()
    assert (
        f"      where the ranks run: {NEEDS_MESSAGE} (not needed here: compute=elsewhere's ranks check their "
        "own environment when they start)\n"
    ) in plan.stdout
    outcome = run_factory(*COMMON, *NEEDS, *elsewhere(tmp_path)).assert_returncode(2)
    assert f"ConfigError: {NEEDS_MESSAGE}" in outcome.stderr  # the job's report quotes the rank's line
    assert f"ddlkit worker (rank 0): ConfigError: {NEEDS_MESSAGE}" in (outcome.job_dir / "rank-0.log").read_text()
    assert not list(outcome.job_dir.glob("checkpoints/*"))  # it failed before training
