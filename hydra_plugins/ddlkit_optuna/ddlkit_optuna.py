"""``hydra/sweeper=optuna_pruning``: Hydra's Optuna sweeper whose study prunes trials as they train.

Hydra's Optuna sweeper tells its study only each trial's final result. This one gives the study a
pruner (``hydra.sweeper.pruner``: any ``optuna.pruners`` class, MedianPruner by default) and hands
each batch's trials to ddlkit's launcher, which reports a trial's metric to its study at each
milestone (``sweep.early_stopping.scheduler=optuna``) and stops it there when the pruner says so;
a pruned trial is told to the study as pruned. The work is :mod:`ddlkit.launch.sweep.optuna`'s.

Hydra imports this module at the start of every Hydra app (it scans ``hydra_plugins``); it defines
the sweeper only where hydra-optuna-sweeper is installed, whose config module Hydra imports anyway.
"""

# no `from __future__ import annotations`: Hydra executes this module without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

try:
    from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
except ImportError:  # pip install -e '.[sweep]' brings it
    OptunaSweeper = None

if OptunaSweeper is not None:

    @dataclass
    class PruningOptunaSweeperConf(OptunaSweeperConf):
        _target_: str = "hydra_plugins.ddlkit_optuna.ddlkit_optuna.PruningOptunaSweeper"
        # the study's pruner, a class of optuna.pruners with its arguments, e.g.
        # 'hydra.sweeper.pruner={_target_: optuna.pruners.HyperbandPruner, min_resource: 1}'; null: MedianPruner()
        pruner: Any = None

    ConfigStore.instance().store(
        group="hydra/sweeper", name="optuna_pruning", node=PruningOptunaSweeperConf, provider="ddlkit"
    )

    class PruningOptunaSweeper(OptunaSweeper):
        def __init__(self, pruner: Any = None, **settings: Any) -> None:
            super().__init__(**settings)
            self.pruner = pruner

        def sweep(self, arguments: Any) -> None:
            from ddlkit.launch.sweep.optuna import sweep_with_pruner

            return sweep_with_pruner(self.sweeper, self.pruner, arguments)
