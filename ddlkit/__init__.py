"""ddlkit: plugin-based, config-driven data-parallel training.

The public facade: the hook marker, the registration record, the five interfaces, the
framework-neutral batch and the image descriptions a framework may build its own pipeline from,
what a plugin may use of the run it is handed (:class:`RunContext`, with :class:`DistView` and
:class:`Schedule`) and the rank's :class:`Run` that implements it, and the errors; the shared
optimizer schemas in :mod:`ddlkit.optim`, constraints on schema fields in :mod:`ddlkit.options`,
bring-your-own-code helpers in :mod:`ddlkit.custom`, the job directory's layout and exit statuses
in :mod:`ddlkit.jobdir`, the fields of ``result.json`` in :mod:`ddlkit.result`. Everything else
is internal.
"""

from ._version import __version__ as __version__
from .errors import (
    ConfigError,
    DdlkitError,
    JobFailedError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    RunError,
    UnknownNameError,
)
from .hookspecs import hookimpl, hookspec
from .interfaces import (
    JOB_FILE,
    WORKER_ARGS,
    Batch,
    ComputeTarget,
    DataInfo,
    DataSource,
    DistView,
    Framework,
    ImageFilesSpec,
    ImagePoolSpec,
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
    Loader,
    Logger,
    Registration,
    RunContext,
    RunState,
    Schedule,
    Shard,
    StorageBackend,
)
from .rank.distributed import DistContext
from .rank.run import Run
from .rank.schedule import LRSchedule


__all__ = [
    "JOB_FILE",
    "WORKER_ARGS",
    "Batch",
    "ComputeTarget",
    "ConfigError",
    "DataInfo",
    "DataSource",
    "DdlkitError",
    "DistContext",
    "DistView",
    "Framework",
    "ImageFilesSpec",
    "ImagePoolSpec",
    "JobFailedError",
    "JobHandle",
    "JobSpec",
    "JobState",
    "JobStatus",
    "LRSchedule",
    "Loader",
    "Logger",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "Registration",
    "Run",
    "RunContext",
    "RunError",
    "RunState",
    "Schedule",
    "Shard",
    "StorageBackend",
    "UnknownNameError",
    "hookimpl",
    "hookspec",
]
