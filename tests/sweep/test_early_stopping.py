"""sweep.early_stopping end to end: the real CLI, launcher, compute=local and workers, with the fake
framework (deterministic float64 softmax regression, a segment takes about a second) on data it
learns at a speed that depends on the learning rate."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import numpy as np
import pytest

from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.testing import RunFactory, wait_for

from .test_sweep_cli import ledger, start_launcher

pytestmark = pytest.mark.slow

#: 8 classes of 2x2 images in noise: 16 steps an epoch; what a trial reaches depends on its learning rate
TRIAL = (
    "framework=fake",
    "logger=[jsonl]",
    "data=custom",
    "data.target=ddlkit.testing.fakes:class_images",
    "data.num_classes=8",
    "data.image_size=2",
    "+data.kwargs.num_classes=8",
    "+data.kwargs.image_size=2",
    "+data.kwargs.val_n=128",
    "trainer.batch_size=16",
    "trainer.epochs=4",
    "trainer.deterministic=true",
)
#: four trials, one at a time (so that the order of arrivals, and so each decision, is fixed);
#: rungs at 1 and 2 epochs of 4, the top half of each goes on
ASHA = (
    "optimizer.lr=0.3,0.0003,0.03,0.003",
    "sweep.max_parallel=1",
    "sweep.early_stopping.scheduler=asha",
    "sweep.early_stopping.reduction_factor=2",
)


def test_asha_pauses_the_worse_half_at_each_rung_and_promotes_by_resuming(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    out = run_factory.cli("-m", *TRIAL, *ASHA, f"hydra.sweep.dir={sweep}", timeout=300).assert_success()
    assert "early stopping: asha on val_top1 (max): rungs at 1, 2 of 4 epochs" in out.stdout
    jobs = ledger(sweep)
    # lr 0.3 arrived first and went on alone; of the four at 1 epoch, the best two went on; of those
    # at 2 epochs, the best one, which trained the full 4 epochs
    status = {n: j["status"] for n, j in jobs.items()}
    assert sorted(status.values()) == ["completed", "paused", "paused", "paused"], out.stdout
    best = next(n for n, s in status.items() if s == "completed")
    assert [(s["from"], s["to"]) for s in jobs[best]["segments"]] == [(0, 1), (1, 2), (2, 4)]
    assert set(jobs[best]["rung_values"]) == {"1", "2", "4"}
    at_one = {n: j["rung_values"]["1"] for n, j in jobs.items()}
    assert set(sorted(at_one, key=lambda n: -at_one[n])[:2]) == {n for n, j in jobs.items() if "2" in j["rung_values"]}
    paused = [n for n, s in status.items() if s == "paused"]
    for num in paused:
        reached = max(map(int, jobs[num]["rung_values"]))
        assert jobs[num]["decision"].startswith(f"paused at {reached} epochs: "), jobs[num]
        assert jobs[num]["target"] == reached  # sent no further than where it paused
    # the trials' compute: 4 first epochs, 2 more from 1 to 2, 2 more from 2 to 4 = 8 of 16
    assert "early stopping (asha) trained 8 of the 16 epochs that every trial to its end takes (50%)" in out.stdout
    report = (sweep / "report.md").read_text()
    assert "| paused at 1 |" in report
    assert "Early stopping (asha) trained 8 of the 16 epochs" in report and "report_curves.png" in report
    assert (sweep / "report_curves.png").read_bytes().startswith(b"\x89PNG")
    rule = json.loads((sweep / "ledger.json").read_text())["early_stopping"]
    assert (rule["rule"], rule["metric"], rule["milestones"]) == ("asha", "val_top1", [1, 2, 4])
    # each segment resumed the last one's checkpoint: the promoted trial ends with the weights of the
    # same config trained straight through, bit for bit
    lr = next(o for o in jobs[best]["overrides"] if o.startswith("optimizer.lr="))
    straight = run_factory(*TRIAL, lr).assert_success()
    assert np.array_equal(np.load(Path(jobs[best]["job_dir"]) / "model.npy"), np.load(straight.job_dir / "model.npy"))
    assert json.loads((Path(jobs[best]["job_dir"]) / "result.json").read_text())["resumed_from_step"] == 32
    # its job says what the sweep decided
    said = run_factory.cli("jobs", "status", jobs[paused[0]]["job_dir"]).assert_success()
    assert "state:     succeeded" in said.stdout and "sweep:     paused at " in said.stdout, said.stdout


def test_an_interrupted_halving_sweep_resumes_to_the_same_decisions(run_factory: RunFactory) -> None:
    """Ctrl-C while a promoted trial's segment runs: it checkpoints and stops; the sweep run again goes
    on from the ledger's decisions and ends where the sweep run straight through ends, bit for bit."""
    straight_dir = run_factory.base_dir / "straight"
    run_factory.cli("-m", *TRIAL, *ASHA, f"hydra.sweep.dir={straight_dir}", timeout=300).assert_success()
    straight = ledger(straight_dir)

    sweep = run_factory.base_dir / "sweep"
    proc = start_launcher(run_factory, ["-m", *TRIAL, *ASHA, "framework.step_delay_s=0.05", f"hydra.sweep.dir={sweep}"])
    try:

        def promoted_and_training() -> bool:  # a segment from 1 epoch on, past its first logged step
            if not (sweep / "ledger.json").is_file():
                return False
            for job in ledger(sweep).values():
                metrics = Path(job["job_dir"]) / "metrics.jsonl"
                if job["status"] == "running" and (job["target"] or 0) > 1 and metrics.is_file():
                    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]
                    return max(steps) > 16
            return False

        wait_for(promoted_and_training, "a promoted trial to train", process=proc, timeout=120)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, stdout + stderr
    interrupted = [n for n, j in ledger(sweep).items() if j["status"] == "interrupted"]
    assert len(interrupted) == 1 and ledger(sweep)[interrupted[0]]["target"] > 1
    hint = next(line for line in stderr.splitlines() if line.startswith("  resume with: "))
    again = run_factory.cli(*shlex.split(hint.removeprefix("  resume with: "))[1:], timeout=300).assert_success()
    assert f"sweep job #{interrupted[0]} started, epochs " in again.stdout and "(resumed)" in again.stdout
    jobs = ledger(sweep)
    assert {n: j["status"] for n, j in jobs.items()} == {n: j["status"] for n, j in straight.items()}
    assert {n: j["rung_values"] for n, j in jobs.items()} == {n: j["rung_values"] for n, j in straight.items()}
    best = next(n for n, j in jobs.items() if j["status"] == "completed")
    assert np.array_equal(np.load(sweep / str(best) / "model.npy"), np.load(straight_dir / str(best) / "model.npy"))


def test_median_stopping_prunes_a_trial_below_the_others_median(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    out = run_factory.cli(
        "-m",
        *TRIAL,
        "optimizer.lr=0.3,0.03,0.1,0.0003",
        "sweep.max_parallel=1",
        "sweep.early_stopping.scheduler=median",
        "sweep.early_stopping.min_samples=2",
        "sweep.early_stopping.reduction_factor=2",
        f"hydra.sweep.dir={sweep}",
        timeout=300,
    ).assert_success()
    jobs = ledger(sweep)
    # the smallest learning rate, last: worse than the median of the three before it at 1 epoch
    assert jobs[3]["status"] == "pruned" and list(jobs[3]["rung_values"]) == ["1"], out.stdout
    assert "is worse than the median" in jobs[3]["decision"]
    assert {jobs[n]["status"] for n in (0, 1, 2)} == {"completed"}
    assert "1 pruned (#3)" in out.stdout


def test_a_bad_early_stopping_setting_is_one_line_before_anything_runs(run_factory: RunFactory) -> None:
    sweep = run_factory.base_dir / "sweep"
    bad = run_factory.cli(
        "-m", *TRIAL, *ASHA, "sweep.early_stopping.metric=accuracy", f"hydra.sweep.dir={sweep}"
    ).assert_returncode(2)
    bad.assert_one_line_error("sweep.early_stopping.metric=accuracy is not a metric these trials log: choose one of")
    assert not (sweep / "0").exists()
    no_jsonl = run_factory.cli("-m", *TRIAL, *ASHA, "logger=[console]", f"hydra.sweep.dir={sweep}")
    no_jsonl.assert_returncode(2).assert_one_line_error("keep jsonl among the loggers")
    factor = run_factory.cli("-m", *TRIAL, *ASHA, "sweep.early_stopping.reduction_factor=1", f"hydra.sweep.dir={sweep}")
    factor.assert_returncode(2).assert_one_line_error("sweep.early_stopping.reduction_factor=1")
    plan = run_factory.cli("plan", "-m", *TRIAL, *ASHA).assert_success()
    assert "ddlkit plan: early stopping: asha on val_top1 (max): rungs at 1, 2 of 4 epochs" in plan.stdout
