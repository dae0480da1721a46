"""Multirun sweeps: ``ddlkit -m`` runs every combination of the swept values as its own job.

* :mod:`.launch` - the launcher behind ``hydra/launcher=ddlkit`` (its docstring holds the design);
* :mod:`.jobs` - ddlkit's own sweeps: validate all, submit to the compute target, ledger, report;
* :mod:`.scheduler` - keeps ``max_parallel`` jobs in flight through the JobHandle contract;
* :mod:`.forked` - a plain Hydra task's job as a forked child process;
* :mod:`.ledger`, :mod:`.report`, :mod:`.settings`, :mod:`.compose`.

``ddlkit plan -m ...`` is this launcher with ``dry_run`` set (:func:`ddlkit.launch.cli.plan_main`).

Nothing here is imported by a single run: the CLI marks its task with a :class:`SweepOnDemand`,
which imports :mod:`.jobs` when the launcher asks for the sweep (issue 29, item 3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sweep import DdlkitSweep

#: the task-function attribute through which the launcher finds ddlkit's sweep support
SWEEP_ATTR = "ddlkit_sweep"


class SweepOnDemand:
    """What the CLI puts on its task as :data:`SWEEP_ATTR`: the launcher calls it for the
    :class:`~.jobs.DdlkitSweep`, made then. Only a multirun has a launcher (``-m``, or
    ``hydra.mode=MULTIRUN`` in a config), so a single run never imports the sweep machinery."""

    def __init__(self, registry: Any, pm: Any) -> None:
        self.registry, self.pm = registry, pm
        self.sweep: DdlkitSweep | None = None

    def __call__(self) -> DdlkitSweep:
        if self.sweep is None:
            from .sweep import DdlkitSweep

            self.sweep = DdlkitSweep(self.registry, self.pm)
        return self.sweep

    @property
    def exit_code(self) -> int | None:
        """The sweep's exit status; None when there was none, or it has not chosen one."""
        return self.sweep.exit_code if self.sweep is not None else None

    def finish(self) -> None:
        if self.sweep is not None:
            self.sweep.finish()
