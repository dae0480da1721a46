"""sweep.early_stopping's decisions (ddlkit.launch.sweep.halving) on scripted values, and the
scheduler running a trial's next segment first: no process, no clock."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ddlkit import ConfigError
from ddlkit.config import SweepEarlyStoppingConfig
from ddlkit.launch.sweep.halving import EarlyStopping, Ladder, Segment, budget_of, check_job, last_value
from ddlkit.launch.sweep.scheduler import Observer, Outcome, SweepJob
from ddlkit.launch.sweep.settings import SweepSettings

from .test_scheduler import Jobs, run

ASHA = SweepEarlyStoppingConfig(scheduler="asha", metric="val_top1", grace=1, reduction_factor=3)
MEDIAN = replace(ASHA, scheduler="median", min_samples=2)


def ladder(options: SweepEarlyStoppingConfig, trials: int, max_t: int = 9) -> Ladder:
    return Ladder(EarlyStopping.from_options(options, max_t=max_t), {n: (None, None) for n in range(trials)})


def test_the_rungs_grow_by_the_reduction_factor_up_to_the_budget() -> None:
    assert EarlyStopping.from_options(ASHA, max_t=9).milestones == (1, 3, 9)
    assert EarlyStopping.from_options(replace(ASHA, grace=2, reduction_factor=2), max_t=10).milestones == (2, 4, 8, 10)
    rule = EarlyStopping.from_options(ASHA, max_t=10)
    assert rule.rungs == (1, 3, 9) and rule.max_t == 10 and rule.next_after(3) == 9 and rule.next_after(9) == 10
    assert rule.budget_key == "trainer.epochs"
    assert EarlyStopping.from_options(replace(ASHA, unit="steps"), max_t=40).budget_key == "trainer.max_steps"
    with pytest.raises(ConfigError, match=r"grace=9 leaves no rung below the trials' budget of 9 epochs"):
        EarlyStopping.from_options(replace(ASHA, grace=9), max_t=9)


@pytest.mark.parametrize(
    ("metric", "mode", "maximize"),
    [("val_top1", "auto", True), ("val_top5", "auto", True), ("val_loss", "auto", False), ("loss", "auto", False)]
    + [("val_loss", "max", True), ("val_top1", "min", False), ("val_f1", "max", True)],
)
def test_which_way_is_better(metric: str, mode: str, maximize: bool) -> None:
    assert EarlyStopping.from_options(replace(ASHA, metric=metric, mode=mode), max_t=9).maximize is maximize


def test_a_metric_auto_cannot_read_asks_for_its_mode() -> None:
    with pytest.raises(ConfigError, match=r"set sweep.early_stopping.mode=max or min"):
        EarlyStopping.from_options(replace(ASHA, metric="val_f1"), max_t=9)


def test_asha_pauses_a_trial_until_it_is_in_the_top_third_of_its_rung() -> None:
    steps = ladder(ASHA, 7)
    # two arrivals: the top floor(2/3) = 0 go on
    assert steps.arrived(0, 1, 0.5).status == "paused"
    first = steps.arrived(1, 1, 0.7)
    assert first.status == "paused" and first.runs == [] and "2 of 2 at 1 epochs by val_top1" not in first.why
    # the third: the best of three goes on, resumed from where it paused
    third = steps.arrived(2, 1, 0.6)
    assert third.status == "paused" and third.runs == [(1, Segment(1, 3))]
    assert steps.target[1] == 3
    # six: the top two; trial 1 went on already, so the second best (trial 2, 0.6) is promoted now, late
    steps.arrived(3, 1, 0.1)
    steps.arrived(4, 1, 0.2)
    sixth = steps.arrived(5, 1, 0.3)
    assert sixth.status == "paused" and sixth.runs == [(2, Segment(1, 3))]
    # a trial better than all of them goes on at once
    best = steps.arrived(6, 1, 0.9)
    assert best.status == "promoted" and best.runs == [(6, Segment(1, 3))]
    assert "1 of 7 at 1 epochs by val_top1 (0.9); the top 2 go on" in best.why


def test_asha_sends_the_top_third_of_each_rung_on_and_completes_at_the_budget() -> None:
    steps = ladder(ASHA, 9)
    for num in range(9):
        steps.arrived(num, 1, (8 - num) / 10)  # best first: trials 0, 1, 2 are the top third of rung 1
    assert {n for n, t in steps.target.items() if t == 3} == {0, 1, 2}
    steps.arrived(0, 3, 0.9)
    steps.arrived(1, 3, 0.8)
    last = steps.arrived(2, 3, 0.7)
    assert last.runs == [(0, Segment(3, 9))]
    done = steps.arrived(0, 9, 0.95)
    assert done.status == "completed" and done.runs == []


def test_ties_go_to_the_trial_that_started_first() -> None:
    steps = ladder(ASHA, 3)
    steps.arrived(2, 1, 0.5)
    steps.arrived(1, 1, 0.5)
    assert steps.arrived(0, 1, 0.5).runs == [(0, Segment(1, 3))]


def test_asha_minimizes_a_loss() -> None:
    steps = ladder(replace(ASHA, metric="val_loss"), 3)
    steps.arrived(0, 1, 2.0)
    steps.arrived(1, 1, 0.5)
    assert steps.arrived(2, 1, 1.0).runs == [(1, Segment(1, 3))]


def test_median_stopping_prunes_a_trial_worse_than_the_median_of_the_others_there() -> None:
    steps = ladder(MEDIAN, 4)
    # fewer than min_samples=2 others at the rung: it goes on
    first = steps.arrived(0, 1, 0.5)
    assert first.status == "promoted" and first.runs == [(0, Segment(1, 3))]
    assert "fewer than min_samples=2" in first.why
    steps.arrived(1, 1, 0.7)
    pruned = steps.arrived(2, 1, 0.4)  # others 0.5, 0.7: median 0.6
    assert pruned.status == "pruned" and pruned.runs == []
    assert "its best val_top1 so far, 0.4, is worse than the median 0.6 of the 2 other trials at 1 epochs" in pruned.why
    kept = steps.arrived(3, 1, 0.65)  # others 0.5, 0.7, 0.4: median 0.5
    assert kept.status == "promoted" and kept.runs == [(3, Segment(1, 3))]


def test_median_stopping_judges_a_trial_by_its_best_so_far() -> None:
    steps = ladder(MEDIAN, 3)
    for num, value in ((0, 0.6), (1, 0.6), (2, 0.9)):
        steps.arrived(num, 1, value)
    steps.arrived(0, 3, 0.7)
    steps.arrived(1, 3, 0.7)
    # it fell to 0.5 at 3 epochs, but its best so far (0.9) beats the others' (0.7)
    assert steps.arrived(2, 3, 0.5).status == "promoted"


def test_a_sweep_started_again_goes_on_from_the_decisions_in_its_ledger() -> None:
    rule = EarlyStopping.from_options(ASHA, max_t=9)
    trials = {
        0: ({"1": 0.9, "3": 0.8, "9": 0.85}, 9),  # completed
        1: ({"1": 0.1}, 1),  # paused at 1
        2: ({"1": 0.8}, 3),  # promoted to 3, interrupted on the way
        3: ({"1": 0.85}, 1),  # paused at 1, but owed a promotion: top 2 of rung 1's 6 (the launcher died first)
        4: (None, 1),  # interrupted in its first segment
        5: ({"1": 0.2}, 1),
        6: (None, None),  # never ran
        7: ({"1": 0.3, "3": 0.2}, 3),  # paused at 3: of rung 3's two values, none goes on
    }
    statuses = {0: "completed", 1: "paused", 2: "interrupted", 3: "paused", 4: "interrupted", 5: "paused"}
    statuses |= {6: "pending", 7: "paused"}
    steps = Ladder(rule, trials)
    runs = steps.begin(list(trials), statuses)
    assert runs == [(3, Segment(1, 3)), (2, Segment(1, 3)), (4, Segment(0, 1)), (6, Segment(0, 1))]
    # asked again (a second resume before anything ran, the promotion recorded): the same runs, none twice
    again = Ladder(rule, {**trials, 3: ({"1": 0.85}, 3)}).begin(list(trials), {**statuses, 3: "promoted"})
    assert sorted(again) == sorted(runs)


def test_the_last_value_of_the_metric_is_read_from_metrics_jsonl(tmp_path: Path) -> None:
    lines = [
        {"step": 10, "split": "train", "loss": 1.5},
        {"step": 10, "split": "val", "val_top1": 0.25, "val_loss": 1.4},
        {"step": 20, "split": "train", "loss": 1.1},
        {"step": 20, "split": "val", "val_top1": 0.5, "val_loss": 1.2},
    ]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines) + '{"step": 30, "split": "tr'  # torn by a crash
    )
    assert last_value(tmp_path, "val_top1") == 0.5
    assert last_value(tmp_path, "loss") == 1.1
    with pytest.raises(ConfigError, match=r"metric=val_top5 is not in .*metrics.jsonl \(it holds loss, val_loss"):
        last_value(tmp_path, "val_top5")
    with pytest.raises(ConfigError, match=r"it holds nothing"):
        last_value(tmp_path / "none", "val_top1")


class _Cfg(dict):
    """The attribute access of a composed config, enough for budget_of and check_job."""

    def __getattr__(self, key: str) -> object:
        return self[key]


def cfg(epochs: int = 9, max_steps: int | None = None, validate: bool = True, loggers: tuple = ("jsonl",)) -> _Cfg:
    return _Cfg(
        trainer=_Cfg(epochs=epochs, max_steps=max_steps, validate=validate),
        logger=dict.fromkeys(loggers, {}),
        model=_Cfg(loss=None),
        data=_Cfg(num_classes=4),
    )


def test_a_trials_budget_and_what_early_stopping_needs_of_it() -> None:
    assert budget_of(ASHA, cfg(epochs=9)) == 9
    assert budget_of(replace(ASHA, max_t=6), cfg(epochs=9)) == 6
    assert budget_of(replace(ASHA, unit="steps"), cfg(max_steps=90)) == 90
    assert budget_of(replace(ASHA, unit="steps", max_t=40), cfg()) == 40
    with pytest.raises(ConfigError, match=r"max_t=12 is beyond the trials' trainer.epochs=9"):
        budget_of(replace(ASHA, max_t=12), cfg(epochs=9))
    with pytest.raises(ConfigError, match=r"count the budget in steps \(sweep.early_stopping.unit=steps\)"):
        budget_of(ASHA, cfg(max_steps=50))
    with pytest.raises(ConfigError, match=r"unit=steps needs the trials' budget in steps"):
        budget_of(replace(ASHA, unit="steps"), cfg())
    check_job(ASHA, cfg())
    with pytest.raises(ConfigError, match=r"keep jsonl among the loggers"):
        check_job(ASHA, cfg(loggers=("console",)))
    with pytest.raises(ConfigError, match=r"trainer.validate=false"):
        check_job(ASHA, cfg(validate=False))
    check_job(replace(ASHA, metric="loss"), cfg(validate=False))
    with pytest.raises(
        ConfigError,
        match=r"metric=val_top5 is not a metric these trials log: choose one of loss, lr, "
        r"images_per_sec, val_loss, val_top1\.$",
    ):
        check_job(replace(ASHA, metric="val_top5"), cfg())  # 4 classes: no top-5


def test_early_stopping_is_for_the_basic_sweeper() -> None:
    settings = SweepSettings(early_stopping={"scheduler": "asha"})  # type: ignore[arg-type]
    assert settings.stopping_options("basic") == SweepEarlyStoppingConfig(scheduler="asha")
    assert SweepSettings().stopping_options("basic") is None
    with pytest.raises(ConfigError, match=r"hydra/sweeper=optuna chooses its own trials"):
        settings.stopping_options("optuna")


class Promoting(Observer):
    """Sends job 0 on to a second segment when its first completes."""

    def __init__(self, jobs: Jobs, second: SweepJob) -> None:
        self.jobs, self.second, self.sent = jobs, second, False
        self.pending: list[SweepJob] = []

    def ended(self, job: SweepJob, outcome: Outcome, *, will_retry: bool) -> None:
        if job.num == 0 and not self.sent:
            self.sent, self.pending = True, [self.second]

    def follow_ups(self) -> list[SweepJob]:
        follow, self.pending = self.pending, []
        return follow


def test_a_trials_next_segment_runs_before_the_waiting_jobs_and_is_no_new_attempt() -> None:
    jobs = Jobs()
    second = replace(jobs.make(0, duration=0.05), continues=True)
    outcomes = run(
        jobs,
        [jobs.make(0, duration=0.01), jobs.make(1, duration=0.2), jobs.make(2), jobs.make(3)],
        observer=Promoting(jobs, second),
    )
    # job 0's first segment ended first: its next one took the free slot, ahead of jobs 2 and 3
    assert jobs.starts() == [0, 1, 0, 2, 3]
    assert outcomes[0].state == "completed" and outcomes[0].attempts == 1
