"""Storage backends: where data is read from and where results are kept."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .run import RunContext


class StorageBackend(ABC):
    """A place holding objects under ``/``-separated keys, plus the two jobs ddlkit needs of it:
    making a dataset readable on this node (:meth:`data_path`) and keeping results
    (:meth:`publish_results`).

    Writes are atomic: a reader sees the whole object or none of it, never a partial one.
    """

    #: URL schemes this backend opens with :meth:`from_url` (``("blob",)`` for
    #: ``blob://container/prefix``); ``ddlkit data upload`` and staging find backends by scheme
    url_schemes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def configure(self, config: DictConfig) -> None:
        """Validate this backend's options against the whole composed ``config`` in the launcher,
        before anything runs; raise ConfigError. Called for the selected backend only (the
        launcher builds it for it: a constructor does no I/O)."""

    @classmethod
    def from_url(cls, url: str) -> StorageBackend:
        """A backend whose keys are relative to ``url`` (one of :attr:`url_schemes`), with
        credentials from the environment, never from the URL."""
        raise NotImplementedError(f"{cls.__name__} cannot be opened from a URL")

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

    def launch_relative(self, root: str, launch_dir: Path) -> str:
        """``data.root`` as ranks that run on the launcher's disk must read it (their working
        directory is the job directory): a relative path names a directory below ``launch_dir``,
        where ``ddlkit`` was started. A backend whose relative roots mean something else on the
        nodes (``storage=nfs``: below its mount) returns ``root`` unchanged."""
        if "://" in root or Path(root).expanduser().is_absolute():  # a URL (blob://, file://) or a path
            return root
        return str(Path(launch_dir) / root)

    def data_path(self, root: str) -> Path:
        """A local directory from which the dataset ``root`` can be read by this node."""
        return Path(root).expanduser()

    def prepare_data(self, root: str, run: RunContext) -> Path:
        """Called on every rank by a data source's ``prepare``: make the dataset ``root`` readable
        on this node and return the local directory. The default reads it in place
        (:meth:`data_path`); a staging backend copies it on each node's local rank 0 while the
        node's other ranks wait at ``run.dist.barrier()``."""
        return self.data_path(root)

    def check_access(self, job_name: str) -> str | None:
        """Called once, on rank 0, before the dataset is staged and training starts: prove now
        that the results of ``job_name`` can be written (a probe write where they will go), not
        after hours of training. Raise :class:`~ddlkit.ConfigError` naming the credential and the
        fix; return one line saying what was checked and with which credential, or None when there
        is nothing to check (results stay in the job directory)."""
        return None

    def publish_results(self, job_dir: Path, job_name: str) -> str | None:
        """Copy the job's results somewhere durable; return where, or None if they stay put."""
        return None
