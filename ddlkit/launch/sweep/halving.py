"""Stopping a sweep's bad trials early (``sweep.early_stopping``): asynchronous successive halving
(``asha``, Li et al. 2020, "A System for Massively Parallel Hyperparameter Tuning") and median
stopping (``median``, as Google Vizier's rule).

A trial runs in *segments*, from one milestone to the next: the rungs ``grace x reduction_factor^k``
below ``max_t``, then ``max_t`` itself (``grace=1 reduction_factor=3 max_t=9`` epochs: 1, 3, 9). A
segment is an ordinary job whose budget ends at the milestone (``trainer.epochs=3``, or
``trainer.max_steps`` with ``unit=steps``): it validates, checkpoints and ends there, and its
metrics.jsonl holds the value the trial is judged by. The next segment is the same job resumed
from that checkpoint with the next budget, so a trial that goes on is never recomputed, and ends
with the weights of the same config run straight through (the learning-rate schedule follows the
epochs, not the budget). Every compute target can run this: all it takes is a job's files once it
ended, which every target brings back.

* **asha**: when a trial reaches a rung it is *paused* there, with its checkpoint; after each
  arrival, every trial in the top ``floor(n / reduction_factor)`` of a rung's ``n`` values that has
  not gone beyond the rung is *promoted* (its next segment runs, first in the queue: the highest
  rung first). A trial paused early may so be promoted later, when more trials reached its rung.
* **optuna** (``hydra/sweeper=optuna_pruning``): at every ``grace``, the trial's value goes to its
  Optuna trial and the study's pruner decides (:mod:`.optuna`).
* **median**: a trial whose best value so far is worse than the median of the best values of the
  other trials that reached the same milestone (at least ``min_samples`` of them) is *pruned*;
  otherwise it goes on to the next milestone.

The decisions are the ledger's (each trial's ``rung_values`` and ``target``, the end of the last
segment it was given): a sweep run again in its directory rebuilds this state from the ledger and
goes on from the decisions already made.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import monitor
from ...errors import ConfigError
from ...jobdir import METRICS_FILE

#: the ledger statuses a trial can have under early stopping, besides the scheduler's
PAUSED, PRUNED, PROMOTED = "paused", "pruned", "promoted"
#: the statuses that end a trial without a failure
FINAL = ("completed", PAUSED, PRUNED)


@dataclass(frozen=True)
class Segment:
    """One run of a trial: from the budget it reached before (0: it starts afresh) to ``to``."""

    start: int
    to: int


@dataclass(frozen=True)
class Verdict:
    """What a trial's arrival at a milestone decided: its status (completed, paused, pruned,
    promoted), why, and the segments to run next (the highest rung's first; this trial's own next
    segment among them when it goes on)."""

    status: str
    why: str
    runs: list[tuple[int, Segment]] = field(default_factory=list)


#: which way the metrics ddlkit logs itself are better (``mode=auto``)
DIRECTIONS = {**monitor.DIRECTIONS, "loss": "min"}
#: what every run logs while it trains (besides its validation metrics)
TRAINING_METRICS = ("loss", "lr", "images_per_sec")


def direction(metric: str, mode: str) -> bool:
    """Whether larger values of ``metric`` are better (``mode`` max or min; auto: ddlkit's own metrics)."""
    if mode in ("max", "min"):
        return mode == "max"
    if metric not in DIRECTIONS:
        raise ConfigError(
            f"sweep.early_stopping.mode=auto cannot tell which way sweep.early_stopping.metric={metric} is better: "
            "set sweep.early_stopping.mode=max or min."
        )
    return DIRECTIONS[metric] == "max"


@dataclass(frozen=True)
class EarlyStopping:
    """The rule a sweep's trials are stopped by, with its milestones (rungs, then ``max_t``)."""

    rule: str
    metric: str
    maximize: bool
    unit: str
    milestones: tuple[int, ...]
    reduction_factor: int
    min_samples: int

    @classmethod
    def from_options(cls, options: Any, *, max_t: int) -> EarlyStopping:
        """The rule ``sweep.early_stopping`` (``options``) asks for, for trials of budget ``max_t``."""
        grace, factor = int(options.grace), int(options.reduction_factor)
        if grace >= max_t:
            raise ConfigError(
                f"sweep.early_stopping.grace={grace} leaves no rung below the trials' budget of {max_t} "
                f"{options.unit} (sweep.early_stopping.max_t, or the trials' own): nothing could be stopped "
                "early. Lower the grace, or raise the budget."
            )
        milestones, at = [], grace
        while at < max_t:  # optuna: every grace, where the study's pruner is asked; else the rungs
            milestones.append(at)
            at = at + grace if options.scheduler == "optuna" else at * factor
        return cls(
            rule=str(options.scheduler),
            metric=str(options.metric),
            maximize=direction(str(options.metric), str(options.mode)),
            unit=str(options.unit),
            milestones=(*milestones, max_t),
            reduction_factor=factor,
            min_samples=int(options.min_samples),
        )

    @property
    def max_t(self) -> int:
        return self.milestones[-1]

    @property
    def rungs(self) -> tuple[int, ...]:
        return self.milestones[:-1]

    @property
    def budget_key(self) -> str:
        """The trainer option a segment's budget sets."""
        return "trainer.epochs" if self.unit == "epochs" else "trainer.max_steps"

    def next_after(self, at: int) -> int:
        return next(m for m in self.milestones if m > at)

    def describe(self) -> str:
        """``asha on val_top1 (max): rungs at 1, 3 of 9 epochs, the top 1/3 of each goes on``."""
        rungs = f"rungs at {', '.join(map(str, self.rungs))} of {self.max_t} {self.unit}"
        how = {
            "asha": f"the top 1/{self.reduction_factor} of each goes on, the others pause",
            "median": f"a trial worse than the median of {self.min_samples}+ others there is pruned",
            "optuna": "at each, the study's pruner (hydra.sweeper.pruner) decides whether a trial goes on",
        }[self.rule]
        return f"{self.rule} on {self.metric} ({'max' if self.maximize else 'min'}): {rungs}; {how}"


def budget_of(options: Any, cfg: Any) -> int:
    """A trial's full budget, in ``sweep.early_stopping.unit``: ``max_t``, or its own
    ``trainer.epochs`` / ``trainer.max_steps``. Raises ConfigError for a budget it cannot have."""
    t = cfg.trainer
    if options.unit == "epochs":
        if t.max_steps is not None:
            raise ConfigError(
                f"sweep.early_stopping.unit=epochs, but the trials stop at trainer.max_steps={t.max_steps}: "
                "count the budget in steps (sweep.early_stopping.unit=steps), or remove trainer.max_steps."
            )
        own, key = int(t.epochs), "trainer.epochs"
    else:
        if t.max_steps is None and options.max_t is None:
            raise ConfigError(
                "sweep.early_stopping.unit=steps needs the trials' budget in steps: set "
                "sweep.early_stopping.max_t=<steps> or trainer.max_steps."
            )
        own, key = int(t.max_steps if t.max_steps is not None else options.max_t), "trainer.max_steps"
    if options.max_t is not None and int(options.max_t) > own:
        raise ConfigError(
            f"sweep.early_stopping.max_t={options.max_t} is beyond the trials' {key}={own}: lower it, or raise {key}."
        )
    return int(options.max_t) if options.max_t is not None else own


def check_job(options: Any, cfg: Any) -> None:
    """What early stopping needs of every trial's config: its metric, logged to metrics.jsonl."""
    if "jsonl" not in (cfg.get("logger") or {}):
        raise ConfigError(
            "sweep.early_stopping reads each trial's metrics.jsonl, which logger=jsonl writes: keep jsonl "
            "among the loggers (e.g. 'logger=[console,jsonl]')."
        )
    validated = monitor.validation_metrics(cfg)
    if options.metric in validated and not cfg.trainer.validate:
        raise ConfigError(
            f"sweep.early_stopping.metric={options.metric} is a validation metric, but trainer.validate=false: "
            "set trainer.validate=true, or compare by the training loss (sweep.early_stopping.metric=loss)."
        )
    logged = [*TRAINING_METRICS, *(validated if cfg.trainer.validate else [])]
    if options.metric not in logged:
        raise ConfigError(
            f"sweep.early_stopping.metric={options.metric} is not a metric these trials log: choose one of "
            f"{', '.join(logged)}."
        )


def last_value(job_dir: Path, metric: str) -> float:
    """The last value of ``metric`` in the job's metrics.jsonl (a line torn by a crash is skipped).
    Raises ConfigError naming the keys it does hold when there is none."""
    path = Path(job_dir) / METRICS_FILE
    value, keys = None, set()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            keys.update(record)
            if isinstance(record.get(metric), int | float):
                value = float(record[metric])
    if value is None:
        held = ", ".join(sorted(keys - {"step", "split", "time"})) or "nothing"
        raise ConfigError(
            f"sweep.early_stopping.metric={metric} is not in {path} (it holds {held}): choose one of those."
        )
    return value


class Ladder:
    """The sweep's trials on their milestones: the values each reached, and how far each was sent."""

    def __init__(self, rule: EarlyStopping, trials: Mapping[int, tuple[Mapping[str, float] | None, int | None]]):
        """``trials``: each trial's ``rung_values`` and ``target`` as the ledger holds them."""
        self.rule = rule
        self.values: dict[int, dict[int, float]] = {
            num: {int(at): float(v) for at, v in (values or {}).items()} for num, (values, _) in trials.items()
        }
        #: the end of the last segment each trial was given (0: none yet)
        self.target: dict[int, int] = {num: int(target or 0) for num, (_, target) in trials.items()}

    def reached(self, num: int) -> int:
        """The last milestone ``num`` reached (0: none)."""
        return max(self.values[num], default=0)

    def begin(self, nums: Iterable[int], statuses: Mapping[int, str]) -> list[tuple[int, Segment]]:
        """What to run when the sweep starts (or starts again in its directory): the promotions
        owed, then the segments that did not end (interrupted, failed, promoted but not started),
        then the trials that never ran."""
        runs = self._promotions()
        owed = {num for num, _ in runs}
        again, new = [], []
        for num in nums:
            reached, target = self.reached(num), self.target[num]
            if num in owed or statuses[num] in FINAL:
                continue
            if target > reached:
                again.append((num, Segment(reached, target)))
            elif reached == 0:
                new.append((num, Segment(0, self.rule.milestones[0])))
        return runs + again + new

    def started(self, num: int, segment: Segment) -> None:
        self.target[num] = segment.to

    def arrived(self, num: int, at: int, value: float) -> Verdict:
        """Trial ``num`` ended a segment at milestone ``at`` with ``value``: what now."""
        self.values[num][at] = value
        rule = self.rule
        if at >= rule.max_t:
            return Verdict("completed", f"reached its full budget of {rule.max_t} {rule.unit}")
        if rule.rule == "median":
            return self._median(num, at)
        runs = self._promotions()
        if any(n == num for n, _ in runs):
            return Verdict(PROMOTED, self._standing(num, at), runs)
        return Verdict(PAUSED, self._standing(num, at), runs)

    # ---------------------------------------------------------------- the rules
    def _key(self, item: tuple[int, float]) -> tuple[float, int]:
        """Best first; ties go to the trial that started first, so that a decision never depends on order."""
        num, value = item
        return (-value if self.rule.maximize else value, num)

    def _promotions(self) -> list[tuple[int, Segment]]:
        """asha: every trial in the top 1/reduction_factor of a rung that was not sent beyond it,
        the highest rung first; each is given its next segment."""
        if self.rule.rule != "asha":
            return []
        runs = []
        for at in reversed(self.rule.rungs):
            entries = [(num, values[at]) for num, values in self.values.items() if at in values]
            for num, _ in sorted(entries, key=self._key)[: len(entries) // self.rule.reduction_factor]:
                if self.target[num] <= at:
                    segment = Segment(at, self.rule.next_after(at))
                    self.target[num] = segment.to
                    runs.append((num, segment))
        return runs

    def _standing(self, num: int, at: int) -> str:
        entries = sorted(((n, v[at]) for n, v in self.values.items() if at in v), key=self._key)
        place = next(i for i, (n, _) in enumerate(entries) if n == num) + 1
        keep = len(entries) // self.rule.reduction_factor
        return (
            f"{place} of {len(entries)} at {at} {self.rule.unit} by {self.rule.metric} "
            f"({self.values[num][at]:.4g}); the top {keep} go on"
        )

    def _best(self, num: int, at: int) -> float:
        values = [v for m, v in self.values[num].items() if m <= at]
        return max(values) if self.rule.maximize else min(values)

    def _median(self, num: int, at: int) -> Verdict:
        rule = self.rule
        best = self._best(num, at)
        others = [self._best(n, at) for n, values in self.values.items() if n != num and at in values]
        if len(others) >= rule.min_samples:
            median = statistics.median(others)
            if (best < median) if rule.maximize else (best > median):
                return Verdict(
                    PRUNED,
                    f"its best {rule.metric} so far, {best:.4g}, is worse than the median {median:.4g} "
                    f"of the {len(others)} other trials at {at} {rule.unit}",
                )
            why = f"its best {rule.metric} so far, {best:.4g}, is no worse than the others' median {median:.4g}"
        else:
            why = f"{len(others)} other trial(s) at {at} {rule.unit}, fewer than min_samples={rule.min_samples}"
        segment = Segment(at, rule.next_after(at))
        self.target[num] = segment.to
        return Verdict(PROMOTED, why, [(num, segment)])
