"""One abstract base class per hook point. Plugins subclass these."""

from .compute import JOB_FILE, WORKER_ARGS, ComputeTarget, JobHandle, JobSpec, JobState, JobStatus
from .data import Batch, DataInfo, DataSource, ImageFilesSpec, ImagePoolSpec, Loader, Shard
from .framework import Framework
from .logger import Logger
from .storage import StorageBackend

__all__ = [
    "JOB_FILE",
    "WORKER_ARGS",
    "Batch",
    "ComputeTarget",
    "DataInfo",
    "DataSource",
    "Framework",
    "ImageFilesSpec",
    "ImagePoolSpec",
    "JobHandle",
    "JobSpec",
    "JobState",
    "JobStatus",
    "Loader",
    "Logger",
    "Shard",
    "StorageBackend",
]
