"""Compute targets: where the ranks of a job run.

The contract is asynchronous so that a local child process, an ``mpirun`` on this machine
and a job on a remote cluster fit it alike (and a sweep can keep many jobs in flight)::

    handle = target.submit(spec)        # returns at once
    for chunk in handle.logs(): ...     # rank 0's output, streamed until the job ends
    status = handle.wait()              # or handle.status() to poll, handle.cancel() to stop
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class JobState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    #: the job's exit code once done (the first failing rank's, for multi-rank jobs)
    exit_code: int | None = None
    #: a human explanation of a failure: which rank, what status, the last log lines
    message: str = ""


@dataclass(frozen=True)
class JobSpec:
    """Everything a compute target needs to run one job."""

    #: unique and filesystem-safe, e.g. "2026-11-22_10-04-01"
    name: str
    #: the job's output directory (shared by all ranks on a real cluster)
    job_dir: Path
    #: the resolved job file every rank reads
    job_file: Path
    #: the command each rank runs, e.g. [python, -m, ddlkit.worker, job.json]
    argv: list[str]
    #: extra environment for the ranks (secrets travel here, never in files)
    env: Mapping[str, str] = field(default_factory=dict)


class JobHandle(ABC):
    """A submitted job."""

    id: str

    @abstractmethod
    def status(self) -> JobStatus: ...

    @abstractmethod
    def logs(self, follow: bool = True) -> Iterator[str]:
        """Rank 0's output in chunks of text; with ``follow`` it ends only when the job ends."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask the job to stop; idempotent."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job is done (or ``timeout`` seconds pass) and return its status."""


class ComputeTarget(ABC):
    """Runs jobs. ``world_size`` is how many ranks a job on this target has."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @property
    def world_size(self) -> int:
        return 1

    @abstractmethod
    def submit(self, spec: JobSpec) -> JobHandle: ...
