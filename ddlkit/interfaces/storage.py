"""Storage backends: where data is read from and where results are kept."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class StorageBackend(ABC):
    """A place holding objects under ``/``-separated keys, plus the two jobs ddlkit needs of it:
    making a dataset readable on this node (:meth:`data_path`) and keeping results
    (:meth:`publish_results`).

    Writes are atomic: a reader sees the whole object or none of it, never a partial one.
    """

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @abstractmethod
    def put(self, local_path: Path, key: str) -> None:
        """Store the file ``local_path`` under ``key``, replacing any previous object atomically."""

    @abstractmethod
    def get(self, key: str, local_path: Path) -> None:
        """Copy the object ``key`` to ``local_path`` (atomically); FileNotFoundError if absent."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with ``prefix``."""

    def data_path(self, root: str) -> Path:
        """A local directory from which the dataset ``root`` can be read by this node."""
        return Path(root).expanduser()

    def publish_results(self, job_dir: Path, job_name: str) -> str | None:
        """Copy the job's results somewhere durable; return where, or None if they stay put."""
        return None
