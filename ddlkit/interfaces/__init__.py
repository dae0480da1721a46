"""One abstract base class per hook point, which plugins subclass, the record a plugin registers
each with (:class:`Registration`), and the protocol of the run they are handed (:class:`RunContext`)."""

from .compute import JOB_FILE, WORKER_ARGS, ComputeTarget, JobHandle, JobSpec, JobState, JobStatus, RestartBudget
from .data import Batch, DataInfo, DataSource, ImageFilesSpec, ImagePoolSpec, Loader, Shard
from .framework import Framework, Profiler
from .logger import Logger
from .registration import Registration
from .run import DistView, RunContext, RunState, Schedule
from .storage import StorageBackend

__all__ = [
    "JOB_FILE",
    "WORKER_ARGS",
    "Batch",
    "ComputeTarget",
    "DataInfo",
    "DataSource",
    "DistView",
    "Framework",
    "ImageFilesSpec",
    "ImagePoolSpec",
    "JobHandle",
    "JobSpec",
    "JobState",
    "JobStatus",
    "Loader",
    "Logger",
    "Profiler",
    "Registration",
    "RestartBudget",
    "RunContext",
    "RunState",
    "Schedule",
    "Shard",
    "StorageBackend",
]
