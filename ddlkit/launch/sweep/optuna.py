"""Optuna's pruners on ddlkit's launcher: ``hydra/sweeper=optuna_pruning`` with
``sweep.early_stopping.scheduler=optuna``.

Hydra's Optuna sweeper asks its study for a batch of trials, has the launcher run them, and tells
the study each one's final result. :func:`sweep_with_pruner` runs that same loop with two changes,
made where the sweeper creates its study: the study gets the configured pruner, and it is wrapped
(:class:`_Study`) so that the trials it hands out reach ddlkit's launcher (:class:`Pruning`), and a
trial the launcher pruned is told to the study as pruned, not complete.

The launcher runs each trial in segments as for asha and median (:mod:`.halving`), here from one
milestone to the next every ``grace`` epochs (or steps) up to ``max_t``: at each, the trial's metric
goes to ``trial.report(value, step)`` and ``trial.should_prune()`` -- the study's pruner, with every
value the study holds -- decides whether it goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from .halving import PROMOTED, PRUNED, EarlyStopping, Ladder, Segment, Verdict


@dataclass
class Pruning:
    """What the sweeper and the launcher share: the trials asked for the next batch, in job order,
    and the numbers of the trials the launcher pruned."""

    asked: list[Any] = field(default_factory=list)
    pruned: set[int] = field(default_factory=set)

    def batch(self, first: int) -> dict[int, Any]:
        """The trials of the batch about to be launched, by job number (from ``first``)."""
        trials, self.asked = self.asked, []
        return {first + i: trial for i, trial in enumerate(trials)}


class _Study:
    """The sweeper's study, with the trials it hands out passed on and pruned ones told as such."""

    def __init__(self, study: Any, pruning: Pruning) -> None:
        self._study, self._pruning = study, pruning

    def ask(self, *args: Any, **kwargs: Any) -> Any:
        trial = self._study.ask(*args, **kwargs)
        self._pruning.asked.append(trial)
        return trial

    def tell(self, trial: Any, state: Any = None, values: Any = None, **kwargs: Any) -> Any:
        import optuna

        if getattr(trial, "number", trial) in self._pruning.pruned:
            return self._study.tell(trial, state=optuna.trial.TrialState.PRUNED, **kwargs)
        return self._study.tell(trial, state=state, values=values, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


def sweep_with_pruner(impl: Any, pruner: Any, arguments: Any) -> None:
    """Run hydra-optuna-sweeper's ``OptunaSweeperImpl.sweep`` (``impl``) with a study that prunes
    by ``pruner`` (an ``optuna.pruners`` object, or its ``_target_`` config; None: MedianPruner)."""
    import optuna
    from hydra.utils import instantiate

    pruning = Pruning()
    impl.launcher.pruning = pruning  # ddlkit's launcher hands each batch's trials to its sweep
    # Hydra instantiated the sweeper's config recursively: the pruner is made already, unless it was given late
    made = pruner if isinstance(pruner, optuna.pruners.BasePruner) else instantiate(pruner) if pruner else None
    made = made or optuna.pruners.MedianPruner()
    create_study = optuna.create_study

    def create(*args: Any, **kwargs: Any) -> _Study:
        return _Study(create_study(*args, pruner=made, **kwargs), pruning)

    # the sweeper's loop calls optuna.create_study once, at its start: that study is the one to prune with
    with mock.patch.object(optuna, "create_study", create):
        impl.sweep(arguments)


class PrunerLadder(Ladder):
    """A batch's trials on their milestones, each one's fate the study's pruner's."""

    def __init__(
        self,
        rule: EarlyStopping,
        trials: Mapping[int, tuple[Mapping[str, float] | None, int | None]],
        study_trials: Mapping[int, Any],
        pruning: Pruning,
    ) -> None:
        super().__init__(rule, trials)
        self.study_trials, self.pruning = study_trials, pruning

    def arrived(self, num: int, at: int, value: float) -> Verdict:
        rule = self.rule
        self.values[num][at] = value
        trial = self.study_trials[num]
        trial.report(value, at)
        if at >= rule.max_t:
            return Verdict("completed", f"reached its full budget of {rule.max_t} {rule.unit}")
        if trial.should_prune():
            self.pruning.pruned.add(trial.number)
            pruner = type(trial.study.pruner).__name__
            return Verdict(PRUNED, f"the study's {pruner} pruned trial {trial.number} ({rule.metric} {value:.4g})")
        segment = Segment(at, rule.next_after(at))
        self.target[num] = segment.to
        kept = f"the study's pruner kept trial {trial.number} ({rule.metric} {value:.4g})"
        return Verdict(PROMOTED, kept, [(num, segment)])
