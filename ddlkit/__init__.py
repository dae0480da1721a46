"""ddlkit: plugin-based, config-driven data-parallel training.

The public facade: the hook marker, the registration record, the five interfaces, the
framework-neutral batch and the image descriptions a framework may build its own pipeline from,
what a plugin may use of the run it is handed (:class:`RunContext`, with :class:`DistView` and
:class:`Schedule`) and the rank's :class:`Run` that implements it, and the errors; the shared
optimizer schemas in :mod:`ddlkit.optim`, constraints on schema fields in :mod:`ddlkit.options`,
bring-your-own-code helpers in :mod:`ddlkit.custom`, the job directory's layout and exit statuses
in :mod:`ddlkit.jobdir`, the fields of ``result.json`` in :mod:`ddlkit.result`; for compute targets,
the scheduler adapter and the one job handle in :mod:`ddlkit.compute.scheduler` and the rule for how a
job ended in :mod:`ddlkit.compute.outcome`, the schema base of a target of ``nodes x procs_per_node``
ranks in :mod:`ddlkit.compute.gang`. Everything else is internal.

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
    "Profiler": ".interfaces",
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
    from .errors import ConfigError as ConfigError
    from .errors import DdlkitError as DdlkitError
    from .errors import JobFailedError as JobFailedError
    from .errors import PluginConflictError as PluginConflictError
    from .errors import PluginError as PluginError
    from .errors import PluginLoadError as PluginLoadError
    from .errors import RankLostError as RankLostError
    from .errors import RunError as RunError
    from .errors import UnknownNameError as UnknownNameError
    from .hookspecs import hookimpl as hookimpl
    from .hookspecs import hookspec as hookspec
    from .interfaces import JOB_FILE as JOB_FILE
    from .interfaces import WORKER_ARGS as WORKER_ARGS
    from .interfaces import Batch as Batch
    from .interfaces import ComputeTarget as ComputeTarget
    from .interfaces import DataInfo as DataInfo
    from .interfaces import DataSource as DataSource
    from .interfaces import DistView as DistView
    from .interfaces import Framework as Framework
    from .interfaces import ImageFilesSpec as ImageFilesSpec
    from .interfaces import ImagePoolSpec as ImagePoolSpec
    from .interfaces import JobHandle as JobHandle
    from .interfaces import JobSpec as JobSpec
    from .interfaces import JobState as JobState
    from .interfaces import JobStatus as JobStatus
    from .interfaces import Loader as Loader
    from .interfaces import Logger as Logger
    from .interfaces import Profiler as Profiler
    from .interfaces import Registration as Registration
    from .interfaces import RestartBudget as RestartBudget
    from .interfaces import RunContext as RunContext
    from .interfaces import RunState as RunState
    from .interfaces import Schedule as Schedule
    from .interfaces import Shard as Shard
    from .interfaces import StorageBackend as StorageBackend
    from .rank.distributed import DistContext as DistContext
    from .rank.run import Run as Run
    from .rank.schedule import LRSchedule as LRSchedule
