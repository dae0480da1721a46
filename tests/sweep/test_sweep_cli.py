"""``ddlkit -m`` and ``ddlkit plan`` end to end: the real CLI, launcher, compute=local and workers,
with the fake framework (a job takes about a second)."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.launch.prepare import job_name
from ddlkit.testing import FAKES_MODULE, RunFactory, interruptible, wait_for

pytestmark = pytest.mark.slow

# 10 steps per epoch; one validation per epoch and one when a job stops early at max_steps
COMMON = (
    "framework=fake",
    "logger=[jsonl]",
    "data.length=320",
    "data.val_length=64",
    "data.num_classes=10",
    "trainer.warmup_steps=1",
    "trainer.log_every=1",
)
# four jobs; the one with max_steps=6 reaches step 6, where the fake framework raises
FOUR_JOBS = ("trainer.max_steps=3,4,5,6", "framework.fail_at_step=6")


def ledger(sweep_dir: Path) -> dict[int, dict[str, Any]]:
    return {int(n): job for n, job in json.loads((sweep_dir / "ledger.json").read_text())["jobs"].items()}


def max_overlap(jobs: dict[int, dict[str, Any]]) -> int:
    """The most jobs running at one moment, from the ledger's start and end times."""
    events = sorted(
        [(j["started"], 1) for j in jobs.values() if j["started"]]
        + [(j["ended"], -1) for j in jobs.values() if j["ended"]]
    )
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def test_keep_going_runs_every_job_in_its_own_directory_and_reports_the_failure(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    out = run_factory.cli("-m", *COMMON, *FOUR_JOBS, f"hydra.sweep.dir={sweep}").assert_returncode(1)

    jobs = ledger(sweep)
    assert {n: (j["status"], j["attempts"]) for n, j in jobs.items()} == {
        0: ("completed", 1),
        1: ("completed", 1),
        2: ("completed", 1),
        3: ("failed", 1),
    }
    assert max_overlap(jobs) == 2  # sweep.max_parallel's default, and the jobs did run side by side
    for num, steps in ((0, 3), (1, 4), (2, 5)):
        job_dir = sweep / str(num)
        result = json.loads((job_dir / "result.json").read_text())
        assert (result["steps"], jobs[num]["result"]["final_loss"]) == (steps, result["final_loss"])
        # its own logger run: metrics.jsonl of this job only
        metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics if m["split"] == "train"] == list(range(1, steps + 1))
        assert json.loads((job_dir / "job.json").read_text())["name"] == job_name(job_dir) == jobs[num]["name"]
        assert job_name(job_dir).startswith(f"sweep_{num}-")
    assert not (sweep / "3" / "result.json").exists()
    assert jobs[3]["exit_code"] == 1 and jobs[3]["log"] == str(sweep / "3" / "rank-0.log")

    # the failure is reported when it happens, with its error and log, before the summary
    failure = out.stdout.index("ddlkit: sweep job #3 failed in")
    assert "RuntimeError: fake framework failure at step 6" in out.stdout[failure:]
    assert out.stdout.index(f"  log: {sweep}/3/rank-0.log", failure) < out.stdout.index("ddlkit: sweep done")
    assert "3 completed, 1 failed (#3)" in out.stdout
    assert (
        f"ddlkit: error: sweep job #3 ({' '.join(COMMON)} trainer.max_steps=6 framework.fail_at_step=6) "
        f"failed (exit status 1); its log: {sweep}/3/rank-0.log\n"
        f"  1 of 4 jobs failed; report: {sweep}/report.md"
    ) in out.stderr

    with open(sweep / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"], r["status"]) for r in rows][-1] == ("3", "trainer.max_steps=6", "failed")
    assert sorted(r["job"] for r in rows) == ["0", "1", "2", "3"]
    completed = [r for r in rows if r["status"] == "completed"]
    assert all(float(r["final_loss"]) > 0 and float(r["images_per_sec"]) > 0 for r in completed)
    best = [float(r["best_top1"]) for r in completed]
    assert best == sorted(best, reverse=True)  # sweep.sort_by=best_top1, best first
    assert "| 3 | trainer.max_steps=6 | failed |" in (sweep / "report.md").read_text()
    assert (sweep / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fail_fast_starts_no_job_after_a_failure(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    out = run_factory.cli(
        "-m",
        *COMMON,
        "trainer.max_steps=3,6,4,5",
        "framework.fail_at_step=6",
        "sweep.on_failure=fail-fast",
        "sweep.max_parallel=1",
        f"hydra.sweep.dir={sweep}",
    ).assert_returncode(1)
    assert {n: j["status"] for n, j in ledger(sweep).items()} == {
        0: "completed",
        1: "failed",
        2: "pending",
        3: "pending",
    }
    assert not (sweep / "2").exists() and not (sweep / "3").exists()
    assert "sweep job #2 started" not in out.stdout
    assert "on_failure=fail-fast" in out.stdout


def long_sweep(sweep: Path) -> list[str]:
    """``-m`` arguments of a sweep of 3 jobs run one at a time, 3125 steps each (about a second):
    long enough to act on while it runs."""
    return [
        "-m",
        *COMMON,
        "data.length=100000",
        "trainer.log_every=20",
        "trainer.epochs=1",
        "trainer.seed=1,2,3",
        "sweep.max_parallel=1",
        f"hydra.sweep.dir={sweep}",
    ]


def start_launcher(run_factory: RunFactory, args: list[str]) -> subprocess.Popen:
    """``ddlkit ARGS`` in the background, with the fakes, interruptible by Ctrl-C as in a terminal."""
    env = {**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}
    return subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args],
        cwd=run_factory.base_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )


def test_an_interrupted_sweep_resumes_where_it_stopped(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    # interrupted mid-run, after job 1's first log line (step 20)
    proc = start_launcher(run_factory, long_sweep(sweep))
    try:
        metrics = sweep / "1" / "metrics.jsonl"
        # job 0 completed, job 1 is training
        wait_for(lambda: metrics.is_file() and metrics.read_text().strip(), "job 1 to train", process=proc)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, stdout + stderr
    jobs = ledger(sweep)
    assert {n: j["status"] for n, j in jobs.items()} == {0: "completed", 1: "interrupted", 2: "pending"}
    assert jobs[1]["exit_code"] == EXIT_PREEMPTED  # it checkpointed and stopped
    hint = next(line for line in stderr.splitlines() if line.startswith("  resume with: "))
    command = shlex.split(hint.removeprefix("  resume with: "))
    assert command[:2] == ["ddlkit", "-m"] and command[-1] == f"hydra.sweep.dir={sweep}"
    first_result = (sweep / "0" / "result.json").read_text()

    plan = run_factory.cli("plan", *command[2:]).assert_success()
    assert "  #0 trainer.seed=1\n      compute=local, world size 1, fake resnet18; completed: skipped" in plan.stdout
    assert "; interrupted: runs again in its directory" in plan.stdout

    out = run_factory.cli(*command[1:]).assert_success()
    assert "1 completed before, skipped" in out.stdout
    assert "sweep job #0 started" not in out.stdout and "sweep job #1 started (attempt 2)" in out.stdout
    jobs = ledger(sweep)
    assert {n: (j["status"], j["attempts"]) for n, j in jobs.items()} == {
        0: ("completed", 1),
        1: ("completed", 2),
        2: ("completed", 1),
    }
    assert (sweep / "0" / "result.json").read_text() == first_result  # not run again
    # job 1 kept its number and directory, and continued from its checkpoint
    assert json.loads((sweep / "1" / "result.json").read_text())["resumed_from_step"] > 0
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]


def test_a_second_launcher_of_a_running_sweep_is_refused_at_once(run_factory: RunFactory) -> None:
    """Two launchers of one sweep directory each ran its jobs and rewrote its ledger, each taking
    the other's jobs for failed ones (issue 23, item 3): the second is refused, the first unharmed."""
    sweep = run_factory.base_dir / "sweep"
    args = long_sweep(sweep)
    first = start_launcher(run_factory, args)
    try:
        wait_for(lambda: (sweep / "0" / "rank-0.log").is_file(), "the first launcher's first job", process=first)
        second = run_factory.cli(*args).assert_returncode(2)
        stdout, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.stderr == (
        f"ddlkit: error: {sweep} is in use by another launcher of this sweep (pid {first.pid} on "
        f"{socket.gethostname()}): wait for it to end (`ddlkit jobs list` shows its jobs), or "
        "stop it (Ctrl-C where it runs, or `kill` its pid: its jobs checkpoint and stop), then "
        "run this command again to resume the sweep.\n"
    )
    assert "started" not in second.stdout
    assert first.returncode == 0, stdout + stderr
    assert {n: j["status"] for n, j in ledger(sweep).items()} == {0: "completed", 1: "completed", 2: "completed"}
    assert run_factory.cli(*args).assert_success().stdout.count("3 completed before, skipped") == 1  # lock released


def test_plan_expands_and_validates_every_job_and_runs_nothing(run_factory: RunFactory) -> None:
    out = run_factory.cli("plan", *COMMON, "trainer.max_steps=3,4", "optimizer.lr=0.1,0.2").assert_success()
    sweep_dir = out.stdout.split(" -> ")[1].split(" (")[0]
    assert out.stdout.startswith(f"ddlkit plan: 4 jobs -> {sweep_dir} (up to 2 at once, on_failure=keep-going)\n")
    assert (
        "  #3 trainer.max_steps=4 optimizer.lr=0.2\n      compute=local, world size 1, fake resnet18; new\n"
        f"      command: ddlkit {' '.join(shlex.quote(a) for a in COMMON)} trainer.max_steps=4 optimizer.lr=0.2 "
        f"hydra.run.dir={sweep_dir}/3\n"
    ) in out.stdout
    assert out.stdout.endswith("ddlkit plan: all 4 jobs are valid; nothing was run.\n")
    assert sorted(p.name for p in run_factory.base_dir.iterdir()) == []  # no sweep directory left behind


def test_plan_of_a_single_run_names_its_job_directory(run_factory: RunFactory) -> None:
    """Not "1 jobs" in a multirun/ directory: the directory the run itself would have."""
    out = run_factory.cli("plan", *COMMON, "hydra.run.dir=runs/r1").assert_success()
    job_dir = run_factory.base_dir / "runs" / "r1"
    # and nothing of a sweep: how many at once, what a failure does to the others, a job number
    assert out.stdout.startswith(f"ddlkit plan: 1 job -> {job_dir}\n      compute=")
    assert "at once" not in out.stdout and "on_failure" not in out.stdout and "#0" not in out.stdout
    assert f"hydra.run.dir={job_dir}\n" in out.stdout
    assert out.stdout.endswith("ddlkit plan: the job is valid; nothing was run.\n")
    default = run_factory.cli("plan", *COMMON).assert_success()
    assert f" -> {run_factory.base_dir}/outputs/" in default.stdout.splitlines()[0]
    assert sorted(p.name for p in run_factory.base_dir.iterdir()) == []  # no directory left behind


def test_without_matplotlib_the_report_says_how_to_get_the_plot(run_factory: RunFactory) -> None:
    hide = run_factory.base_dir.parent / "no-matplotlib"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    out = run_factory.cli("-m", *COMMON, "trainer.max_steps=2", env={"PYTHONPATH": str(hide)}).assert_success()
    assert (
        "(report.csv; no plot: matplotlib is not installed: pip install matplotlib, or pip install -e "
        "'.[sweep]' in ddlkit's checkout)\n"
    ) in out.stdout, out.stdout  # ddlkit[sweep] is on no index


def test_a_failed_validation_leaves_no_empty_job_directory(run_factory: RunFactory) -> None:
    run_factory.cli(*COMMON, "trainer.epochs=0").assert_returncode(2)
    assert sorted(p.name for p in run_factory.base_dir.iterdir()) == []  # was outputs/<date>/<time>/, empty


def test_a_swept_key_given_a_value_too_is_swept_whatever_the_order(run_factory: RunFactory) -> None:
    """The basic sweeper let the later of ``trainer.max_steps=3,4 trainer.max_steps=5`` win: a
    sweep dimension lost in silence (issue 23, item 2)."""
    out = run_factory.cli("plan", *COMMON, "trainer.max_steps=3,4", "trainer.max_steps=5").assert_success()
    assert out.stderr == (
        "ddlkit: note: trainer.max_steps=5 is left out: the sweep trainer.max_steps=3,4 gives "
        "trainer.max_steps its values\n"
    )
    assert "  #0 trainer.max_steps=3\n" in out.stdout and "  #1 trainer.max_steps=4\n" in out.stdout


def test_a_bad_value_in_any_job_is_reported_before_any_job_starts(run_factory: RunFactory) -> None:
    message = (
        "ddlkit: error: 2 of 4 sweep jobs are invalid; no job was started:\n"
        f"  job #1 ({' '.join(COMMON)} trainer.max_steps=3 optimizer.lr=-1): "
        "optimizer.lr=-1.0 is invalid: it must be positive.\n"
        f"  job #3 ({' '.join(COMMON)} trainer.max_steps=4 optimizer.lr=-1): "
        "optimizer.lr=-1.0 is invalid: it must be positive.\n"
    )
    sweeps = ("trainer.max_steps=3,4", "optimizer.lr=0.1,-1")
    plan = run_factory.cli("plan", *COMMON, *sweeps).assert_returncode(2)
    assert plan.stderr == message and plan.stdout == ""
    sweep = run_factory.base_dir / "sweep"
    out = run_factory.cli("-m", *COMMON, *sweeps, f"hydra.sweep.dir={sweep}").assert_returncode(2)
    assert out.stderr == message
    assert [p.name for p in sweep.iterdir()] == ["multirun.yaml"]  # Hydra's record of the command; no job


@pytest.mark.plugins  # compute=local_mpi: ddlkit-mpi
@pytest.mark.extras  # OpenMPI's mpirun
def test_a_sweep_of_two_rank_jobs_on_local_mpi(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    out = run_factory.cli(
        "-m",
        *COMMON,
        "compute=local_mpi",
        "compute.procs_per_node=2",
        "dist=native",
        "trainer.max_steps=3,4",
        f"hydra.sweep.dir={sweep}",
        timeout=240,
    ).assert_success()
    jobs = ledger(sweep)
    assert {n: j["status"] for n, j in jobs.items()} == {0: "completed", 1: "completed"}, out.stdout
    for num, steps in ((0, 3), (1, 4)):
        result = json.loads((sweep / str(num) / "result.json").read_text())
        assert (result["world_size"], result["steps"]) == (2, steps)
        # each job is a whole mpirun job: a log per rank, in the job's own directory
        assert (sweep / str(num) / "rank-1.log").is_file()
    plan = run_factory.cli(
        "plan", *COMMON, "compute=local_mpi", "compute.procs_per_node=2", "dist=native", "trainer.max_steps=3,4"
    ).assert_success()
    assert "compute=local_mpi, world size 2" in plan.stdout
