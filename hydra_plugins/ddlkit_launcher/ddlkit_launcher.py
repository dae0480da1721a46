"""``hydra/launcher=ddlkit``: keeps up to ``max_parallel`` sweep jobs in flight (ddlkit's default for ``-m``).

Hydra finds this module by scanning the ``hydra_plugins`` namespace package at every start of
every Hydra app, so it imports nothing but its config schema here; the work is done by
:mod:`ddlkit.launch.sweep.launch` (its docstring describes the design).
"""

# no `from __future__ import annotations`: Hydra executes this module without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig


@dataclass
class DdlkitLauncherConf:
    """Each setting is the app's own ``sweep.*`` key when its config has one (ddlkit's does:
    ``ddlkit -m ... sweep.max_parallel=4``); null: the launcher's default. The defaults and what
    each setting means are :class:`ddlkit.launch.sweep.settings.SweepSettings`' alone (this module, which
    Hydra imports in every app, does not import ddlkit)."""

    _target_: str = "hydra_plugins.ddlkit_launcher.ddlkit_launcher.DdlkitLauncher"
    max_parallel: Any = "${oc.select:sweep.max_parallel,null}"
    on_failure: Any = "${oc.select:sweep.on_failure,null}"
    sort_by: Any = "${oc.select:sweep.sort_by,null}"
    objective: Any = "${oc.select:sweep.objective,null}"
    direction: Any = "${oc.select:sweep.direction,null}"
    early_stopping: Any = "${oc.select:sweep.early_stopping,null}"
    status_interval_s: float | None = None
    dry_run: bool | None = None


ConfigStore.instance().store(group="hydra/launcher", name="ddlkit", node=DdlkitLauncherConf, provider="ddlkit")


class DdlkitLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        from ddlkit.launch.sweep.settings import SweepSettings

        # checked at launch, where a bad value can be reported in the app's terms (sweep.* for ddlkit)
        self.settings = SweepSettings(**{key: value for key, value in settings.items() if value is not None})
        #: set by hydra/sweeper=optuna_pruning: the trials its study asks for (ddlkit.launch.sweep.optuna)
        self.pruning: Any = None
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: "HydraContext", task_function: "TaskFunction", config: "DictConfig") -> None:
        from ddlkit.launch.sweep.compose import SharedCompositions
        from ddlkit.launch.sweep.settings import check_sweeper

        # the sweeper sets its launcher up before its first trial: the last moment to refuse it
        check_sweeper(config.hydra.get("sweeper"))
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        # the sweeper composes each job to validate the batch before launch() composes it again
        SharedCompositions.install(hydra_context.config_loader)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> "Sequence[JobReturn]":
        from ddlkit.launch.sweep.launch import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return launch(
            self.settings,
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=self.config,
            job_overrides=job_overrides,
            initial_job_idx=initial_job_idx,
            pruning=self.pruning,
        )
