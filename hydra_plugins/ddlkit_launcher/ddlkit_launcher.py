"""``hydra/launcher=ddlkit``: keeps up to ``max_parallel`` sweep jobs in flight (ddlkit's default for ``-m``).

Hydra finds this module by scanning the ``hydra_plugins`` namespace package at every start of
every Hydra app, so it imports nothing but its config schema here; the work is done by
:mod:`ddlkit.sweep.launch` (its docstring describes the design).
"""

# no `from __future__ import annotations`: Hydra executes this module without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig


@dataclass
class DdlkitLauncherConf:
    """Each setting defaults to the app's own ``sweep.*`` key when its config has one (ddlkit's does:
    ``ddlkit -m ... sweep.max_parallel=4``), else to the value after the comma."""

    _target_: str = "hydra_plugins.ddlkit_launcher.ddlkit_launcher.DdlkitLauncher"
    # jobs in flight at once; a new one starts as soon as one ends
    max_parallel: Any = "${oc.select:sweep.max_parallel,2}"
    # keep-going, fail-fast, or retry:N (re-run a failed job up to N times, then keep going)
    on_failure: Any = "${oc.select:sweep.on_failure,keep-going}"
    # ddlkit sweeps: the report's sort key and plotted metric (best_top1, final_loss, images_per_sec, duration_s)
    sort_by: Any = "${oc.select:sweep.sort_by,best_top1}"
    # ddlkit sweeps: the result field returned to the sweeper (a search sweeper optimizes it), and its direction
    objective: Any = "${oc.select:sweep.objective,null}"
    direction: Any = "${oc.select:sweep.direction,auto}"
    # seconds between two looks at the running jobs' status
    poll_interval_s: float = 0.05
    # expand, compose and validate every job and print them, run nothing (what `ddlkit plan` sets)
    dry_run: bool = False


ConfigStore.instance().store(group="hydra/launcher", name="ddlkit", node=DdlkitLauncherConf, provider="ddlkit")


class DdlkitLauncher(Launcher):
    def __init__(self, max_parallel: int = 2, on_failure: str = "keep-going", sort_by: str = "best_top1",
                 objective: Optional[str] = None, direction: str = "auto", poll_interval_s: float = 0.05,
                 dry_run: bool = False) -> None:
        from ddlkit.sweep.settings import SweepSettings

        # checked at launch, where a bad value can be reported in the app's terms (sweep.* for ddlkit)
        self.settings = SweepSettings(max_parallel=max_parallel, on_failure=on_failure, sort_by=sort_by,
                                      objective=objective, direction=direction, poll_interval_s=poll_interval_s,
                                      dry_run=dry_run)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: "HydraContext", task_function: "TaskFunction", config: "DictConfig") -> None:
        from ddlkit.sweep.compose import SharedCompositions
        from ddlkit.sweep.settings import check_sweeper

        # the sweeper sets its launcher up before its first trial: the last moment to refuse it
        check_sweeper(config.hydra.get("sweeper"))
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        # the sweeper composes each job to validate the batch before launch() composes it again
        SharedCompositions.install(hydra_context.config_loader)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> "Sequence[JobReturn]":
        from ddlkit.sweep.launch import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return launch(self.settings, hydra_context=self.hydra_context, task_function=self.task_function,
                      config=self.config, job_overrides=job_overrides, initial_job_idx=initial_job_idx)
