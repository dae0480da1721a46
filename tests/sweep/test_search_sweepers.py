"""Hydra's search sweepers on ddlkit's launcher (issue 16): Optuna optimizes ``sweep.objective``,
failed trials are told to it as failed, and a search that cannot complete exits non-zero."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from ddlkit.testing import RunFactory

pytestmark = [pytest.mark.slow, pytest.mark.extras]  # hydra/sweeper=optuna: pip install -e '.[sweep]'

STUDY = (
    "-m",
    "framework=fake",
    "data.length=64",
    "data.val_length=16",
    "data.num_classes=10",
    "trainer.epochs=1",
    "hydra/sweeper=optuna",
    "hydra.sweeper.n_trials=4",
    "hydra.sweeper.n_jobs=2",
    "hydra.sweeper.sampler.seed=0",
)


def test_optuna_optimizes_the_objective_and_every_trial_is_in_the_ledger(run_factory: RunFactory) -> None:
    sweep_dir = run_factory.base_dir / "study"
    out = run_factory.cli(
        *STUDY,
        "sweep.objective=final_loss",
        "optimizer.lr=interval(0.01,1.0)",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    ).assert_success()
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    losses = {num: job["result"]["final_loss"] for num, job in jobs.items() if job["status"] == "completed"}
    assert len(jobs) == len(losses) == 4, out.output
    best = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert best.best_value == min(losses.values())  # the launcher returned each trial's final_loss
    assert "4 jobs" in (sweep_dir / "report.md").read_text()
    # one sweep, however many batches: one header, one report, and the best trial at the end
    for once in ("ddlkit: sweep by ", "# Sweep ", "ddlkit: sweep done "):
        assert out.stdout.count(once) == 1, out.stdout
    assert "ddlkit: sweep of " not in out.stdout
    assert f"ddlkit: sweep by hydra/sweeper=optuna, in batches of 2 -> {sweep_dir} " in out.stdout
    num = min(losses, key=losses.get)
    lr = next(o for o in jobs[num]["overrides"] if o.startswith("optimizer.lr="))
    assert out.stdout.splitlines()[-1] == (
        f"ddlkit: best of 4 trials: {lr} -> final_loss {best.best_value} (job #{num}, {sweep_dir / num})"
    )


def test_failed_trials_are_failed_for_the_study_and_a_search_without_results_exits_1(run_factory: RunFactory) -> None:
    sweep_dir = run_factory.base_dir / "failing"
    out = run_factory.cli(
        *STUDY,
        "sweep.objective=final_loss",
        "framework.fail_at_step=1",
        "hydra.sweeper.max_failure_rate=1.0",
        "optimizer.lr=interval(0.01,1.0)",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    ).assert_returncode(1)
    assert out.stderr.strip().splitlines()[-1] == (
        "ddlkit: error: the sweep could not complete: ValueError: No trials "
        "are completed yet. (HYDRA_FULL_ERROR=1 shows where)"
    )
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    assert [job["status"] for job in jobs.values()] == ["failed"] * 4  # every trial ran and was told as failed


def test_plan_shows_the_first_batch_of_a_study(run_factory: RunFactory) -> None:
    out = run_factory.cli(
        "plan", *STUDY[1:], "sweep.objective=final_loss", "optimizer.lr=interval(0.01,1.0)", timeout=120
    ).assert_success()
    assert out.stdout.count("      command: ddlkit optimizer.lr=") == 2
    assert out.stdout.strip().endswith(
        "chooses the values of each batch of trials from the results before it; these are its first 2."
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            (),
            "hydra/sweeper=optuna searches for the best value of one number: name it with sweep.objective=<a result "
            "field> (images_per_sec, final_loss, best_top1, top1, top5, val_loss, steps, epochs, world_size, "
            "global_batch_size, wall_time_s).",
        ),
        (
            ("sweep.objective=accuracy",),
            "sweep.objective=accuracy is no field of a job's result: choose one of "
            "images_per_sec, final_loss, best_top1, top1, top5, val_loss, steps, epochs, "
            "world_size, global_batch_size, wall_time_s.",
        ),
        (
            ("sweep.objective=best_top1",),
            "hydra/sweeper=optuna will minimize sweep.objective=best_top1, which is to be "
            "maximized: add hydra.sweeper.direction=maximize, or set "
            "sweep.direction=minimize.",
        ),
    ],
)
def test_an_objective_the_search_cannot_use_is_refused_before_any_trial(
    setting: tuple[str, ...], message: str, run_factory: RunFactory
) -> None:
    out = run_factory.cli(*STUDY, *setting, "optimizer.lr=interval(0.01,1.0)", timeout=120).assert_returncode(2)
    assert out.stderr.strip().splitlines()[-1] == f"ddlkit: error: {message}"
    assert not list(run_factory.base_dir.glob("multirun/*/*/0"))  # no trial ran


def test_a_searched_key_given_a_value_too_is_searched(run_factory: RunFactory) -> None:
    """``T trainer.batch_size=int(interval(2,6))`` with ``T`` setting ``trainer.batch_size=8``:
    Optuna kept the fixed value, every trial was the same, in silence (issue 23, item 2)."""
    sweep_dir = run_factory.base_dir / "both"
    out = run_factory.cli(
        *STUDY,
        "hydra.sweeper.n_trials=2",
        "sweep.objective=final_loss",
        "trainer.batch_size=8",
        "trainer.batch_size=int(interval(2,6))",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    ).assert_success()
    assert (
        "ddlkit: note: trainer.batch_size=8 is left out: the sweep trainer.batch_size=int(interval(2,6)) gives "
        "trainer.batch_size its values\n"
    ) in out.stderr
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"].values()
    sizes = [
        next(int(o.split("=")[1]) for o in job["overrides"] if o.startswith("trainer.batch_size=")) for job in jobs
    ]
    assert len(sizes) == 2 and all(2 <= s <= 6 for s in sizes), sizes


def test_a_study_of_no_trials_is_refused(run_factory: RunFactory) -> None:
    out = run_factory.cli(
        *STUDY, "hydra.sweeper.n_trials=0", "sweep.objective=final_loss", "optimizer.lr=interval(0.01,1.0)", timeout=120
    ).assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: hydra.sweeper.n_trials=0 is invalid: it must be at least 1 (the trials to run).\n"
    )


def test_a_key_an_experiment_searches_given_a_value_too_is_searched(run_factory: RunFactory) -> None:
    """``+experiment=<name> optimizer.lr=0.5`` where the experiment's ``hydra.sweeper.params``
    searches optimizer.lr: Optuna kept 0.5 in every trial, in silence (issue 37, item 12). And
    Optuna's log lines reach a pipe without colour codes (item 15)."""
    (run_factory.base_dir / "experiments").mkdir()
    (run_factory.base_dir / "experiments" / "lr_search.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      optimizer.lr: interval(0.01, 0.4)\n"
    )
    sweep_dir = run_factory.base_dir / "searched"
    out = run_factory.cli(
        *STUDY,
        "hydra.sweeper.n_trials=2",
        "sweep.objective=final_loss",
        "+experiment=lr_search",
        "optimizer.lr=0.5",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    ).assert_success()
    assert (
        "ddlkit: note: optimizer.lr=0.5 is left out: the sweep of experiment lr_search (optimizer.lr: "
        "interval(0.01, 0.4)) gives optimizer.lr its values\n"
    ) in out.stderr
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"].values()
    lrs = [next(float(o.split("=")[1]) for o in job["overrides"] if o.startswith("optimizer.lr=")) for job in jobs]
    assert len(set(lrs)) == 2 and all(0.01 <= lr <= 0.4 for lr in lrs), lrs
    assert "A new study created" in out.stderr and "\x1b[" not in out.stderr
