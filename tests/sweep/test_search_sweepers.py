"""Hydra's search sweepers on ddlkit's launcher (issue 16): Optuna optimizes ``sweep.objective``,
failed trials are told to it as failed, and a search that cannot complete exits non-zero."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from ddlkit.testing import RunFactory

from .test_early_stopping import TRIAL

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


#: the trials of test_early_stopping's sweeps (8 classes in noise, 4 epochs), sampled by a study that prunes
PRUNED_STUDY = (
    "-m",
    *TRIAL,
    "hydra/sweeper=optuna_pruning",
    "hydra.sweeper.n_trials=6",
    "hydra.sweeper.n_jobs=2",
    "hydra.sweeper.sampler.seed=1",
    "hydra.sweeper.direction=maximize",
    "sweep.objective=best_top1",
    "sweep.early_stopping.scheduler=optuna",
    "optimizer.lr=tag(log, interval(0.0001, 1))",
)


def test_optunas_pruner_stops_trials_as_they_train(run_factory: RunFactory) -> None:
    """hydra/sweeper=optuna_pruning: each trial reports val_top1 to its Optuna trial at every epoch; the
    study's pruner (MedianPruner after 2 trials) stops the bad ones there, and the best trial the
    study names is one that trained all 4 epochs. (What the study holds: the test below, in-process:
    Optuna's SQLite storage does not work with the SQLAlchemy here, and the default study is in memory.)"""
    sweep_dir = run_factory.base_dir / "pruned"
    out = run_factory.cli(
        *PRUNED_STUDY,
        "hydra.sweeper.pruner={_target_: optuna.pruners.MedianPruner, n_startup_trials: 2}",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    ).assert_success()
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    statuses = {int(num): job["status"] for num, job in jobs.items()}
    pruned = sorted(n for n, s in statuses.items() if s == "pruned")
    assert pruned and set(statuses.values()) == {"completed", "pruned"}, out.stdout
    for num, job in jobs.items():
        reached = max(map(int, job["rung_values"]))
        assert list(job["rung_values"]) == [str(at) for at in range(1, reached + 1)]  # reported every epoch
        if job["status"] == "pruned":
            said = f"pruned at {reached} epochs: the study's MedianPruner pruned trial {num} "
            assert job["decision"].startswith(said), job
        else:
            assert reached == 4
    best = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    complete = {n: job["result"]["best_top1"] for n, job in jobs.items() if job["status"] == "completed"}
    assert best.best_value == max(complete.values())
    assert f"{len(pruned)} pruned ({', '.join(f'#{n}' for n in pruned)})" in out.stdout


def test_the_study_is_told_of_each_value_and_of_the_trials_pruned() -> None:
    """The launcher's side against a real Optuna study: each value a trial reaches goes to its study
    trial; the pruner's decision is the verdict; a pruned trial is told to the study as pruned when
    the sweeper tells it its result."""
    import optuna

    from ddlkit.config import SweepEarlyStoppingConfig
    from ddlkit.launch.sweep.halving import EarlyStopping
    from ddlkit.launch.sweep.optuna import PrunerLadder, Pruning, _Study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruning = Pruning()
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2)
    study = _Study(optuna.create_study(direction="maximize", pruner=pruner), pruning)
    asked = [study.ask() for _ in range(3)]
    rule = EarlyStopping.from_options(SweepEarlyStoppingConfig(scheduler="optuna", grace=1), max_t=3)
    assert rule.milestones == (1, 2, 3)
    trials = pruning.batch(10)
    assert list(trials) == [10, 11, 12] and [t.number for t in trials.values()] == [0, 1, 2]
    ladder = PrunerLadder(rule, dict.fromkeys(trials, (None, None)), trials, pruning)
    for num, values in ((10, (0.5, 0.6, 0.7)), (11, (0.7, 0.8, 0.9))):  # the startup trials: never pruned
        assert [ladder.arrived(num, at, value).status for at, value in enumerate(values, 1)] == [
            "promoted",
            "promoted",
            "completed",
        ]
    low = ladder.arrived(12, 1, 0.55)  # before the startup trials finished: not pruned
    assert low.status == "promoted" and "the study's pruner kept trial 2 (val_top1 0.55)" in low.why
    for trial, value in zip(asked[:2], (0.7, 0.9), strict=True):  # the sweeper tells their results
        study.tell(trial, optuna.trial.TrialState.COMPLETE, [value])
    worse = ladder.arrived(12, 2, 0.6)  # below the median (0.7) of the others at step 2
    assert worse.status == "pruned" and "the study's MedianPruner pruned trial 2 (val_top1 0.6)" in worse.why
    study.tell(asked[2], optuna.trial.TrialState.COMPLETE, [0.6])
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert study.trials[1].intermediate_values == {1: 0.7, 2: 0.8, 3: 0.9}
    assert study.trials[2].intermediate_values == {1: 0.55, 2: 0.6}


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (
            ("hydra/sweeper=optuna_pruning", "sweep.objective=best_top1", "sweep.early_stopping.scheduler=none"),
            "hydra/sweeper=optuna_pruning prunes the trials its study asks for: set sweep.early_stopping.scheduler=",
        ),
        (
            ("hydra/sweeper=optuna", "sweep.objective=best_top1", "sweep.early_stopping.scheduler=asha"),
            "sweep.early_stopping.scheduler=asha stops the trials of a grid (the basic sweeper); hydra/sweeper=optuna",
        ),
        (
            ("sweep.early_stopping.scheduler=optuna", "optimizer.lr=0.1,0.2"),
            "sweep.early_stopping.scheduler=optuna lets an Optuna study's pruner stop trials: select",
        ),
        (
            (
                "hydra/sweeper=optuna_pruning",
                "sweep.objective=best_top1",
                "sweep.early_stopping.scheduler=optuna",
                "sweep.early_stopping.metric=val_loss",
            ),
            "sweep.early_stopping.metric=val_loss is better down, but the study's direction is maximize",
        ),
    ],
)
def test_early_stopping_and_the_sweeper_must_agree(run_factory: RunFactory, given: tuple[str, ...], error: str) -> None:
    sweep_dir = run_factory.base_dir / "refused"
    own = ("hydra/sweeper=", "hydra.sweeper.", "sweep.", "optimizer.lr=")
    study = [a for a in PRUNED_STUDY if not a.startswith(own)]
    lr = () if any(a.startswith("optimizer.lr=") for a in given) else ("optimizer.lr=interval(0.001, 1)",)
    search = ("hydra.sweeper.direction=maximize",) if any(a.startswith("hydra/sweeper=") for a in given) else ()
    out = run_factory.cli(*study, *search, *lr, *given, f"hydra.sweep.dir={sweep_dir}")
    out.assert_returncode(2).assert_one_line_error(error)
    assert not (sweep_dir / "0").exists()
