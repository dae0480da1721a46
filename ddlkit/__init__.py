"""ddlkit: plugin-based, config-driven data-parallel training.

The public facade: the hook marker, the registration record, the five interfaces, the
framework-neutral batch and the image descriptions a framework may build its own pipeline from,
what a plugin may use of the run it is handed (:class:`RunContext`, with :class:`DistView` and
:class:`Schedule`) and the rank's :class:`Run` that implements it, and the errors; the shared
optimizer schemas in :mod:`ddlkit.optim`, constraints on schema fields in :mod:`ddlkit.options`,
bring-your-own-code helpers in :mod:`ddlkit.custom`, the job directory's layout and exit statuses
in :mod:`ddlkit.jobdir`, the fields of ``result.json`` in :mod:`ddlkit.result`. Everything else
is internal.

The names load when first used (PEP 562), so ``import ddlkit`` -- and any of its stdlib-only
modules, such as :mod:`ddlkit.jobdir` or the rank minder every cluster target starts once per
rank -- costs nothing of the training stack (OmegaConf, pluggy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

#: each public name and the module it comes from, imported when first used
_EXPORTS: dict[str, str] = {
    "ConfigError": ".errors",
    "DdlkitError": ".errors",
    "JobFailedError": ".errors",
    "PluginConflictError": ".errors",
    "PluginError": ".errors",
    "PluginLoadError": ".errors",
    "RankLostError": ".errors",
    "RunError": ".errors",
    "UnknownNameError": ".errors",
    "hookimpl": ".hookspecs",
    "hookspec": ".hookspecs",
    "JOB_FILE": ".interfaces",
    "WORKER_ARGS": ".interfaces",
    "Batch": ".interfaces",
    "ComputeTarget": ".interfaces",
    "DataInfo": ".interfaces",
    "DataSource": ".interfaces",
    "DistView": ".interfaces",
    "Framework": ".interfaces",
    "ImageFilesSpec": ".interfaces",
    "ImagePoolSpec": ".interfaces",
    "JobHandle": ".interfaces",
    "JobSpec": ".interfaces",
    "JobState": ".interfaces",
    "JobStatus": ".interfaces",
    "Loader": ".interfaces",
    "Logger": ".interfaces",
    "Registration": ".interfaces",
    "RestartBudget": ".interfaces",
    "RunContext": ".interfaces",
    "RunState": ".interfaces",
    "Schedule": ".interfaces",
    "Shard": ".interfaces",
    "StorageBackend": ".interfaces",
    "DistContext": ".rank.distributed",
    "Run": ".rank.run",
    "LRSchedule": ".rank.schedule",
}

__all__ = sorted(_EXPORTS, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        # not a facade name: a submodule (``from ddlkit import jobdir``) is imported by the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next use is a plain lookup
    return value


def __dir__() -> list[str]:
    """The facade's names, whether loaded yet or not."""
    return [*__all__, "__version__"]


if TYPE_CHECKING:  # the same names, for type checkers and editors ("X as X": re-exported, also under --strict)
    from .errors import (ConfigError as ConfigError, DdlkitError as DdlkitError, JobFailedError as JobFailedError,
                         PluginConflictError as PluginConflictError, PluginError as PluginError,
                         PluginLoadError as PluginLoadError, RankLostError as RankLostError, RunError as RunError,
                         UnknownNameError as UnknownNameError)
    from .hookspecs import hookimpl as hookimpl, hookspec as hookspec
    from .interfaces import (JOB_FILE as JOB_FILE, WORKER_ARGS as WORKER_ARGS, Batch as Batch,
                             ComputeTarget as ComputeTarget, DataInfo as DataInfo, DataSource as DataSource,
                             DistView as DistView, Framework as Framework, ImageFilesSpec as ImageFilesSpec,
                             ImagePoolSpec as ImagePoolSpec, JobHandle as JobHandle, JobSpec as JobSpec,
                             JobState as JobState, JobStatus as JobStatus, Loader as Loader, Logger as Logger,
                             Registration as Registration, RestartBudget as RestartBudget, RunContext as RunContext,
                             RunState as RunState, Schedule as Schedule, Shard as Shard,
                             StorageBackend as StorageBackend)
    from .rank.distributed import DistContext as DistContext
    from .rank.run import Run as Run
    from .rank.schedule import LRSchedule as LRSchedule
