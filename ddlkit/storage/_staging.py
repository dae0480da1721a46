"""Staging storages: data staged to each node's local disk, results published to a location.

:class:`StagingStorage` is the base of ``storage=local_ssd`` and of storage backends for remote
object stores (``ddlkit-azure``'s ``storage=azure``): it stages ``data.root`` (a directory or a URL
that :func:`~ddlkit.storage.open_storage` resolves) into ``<scratch>/datasets/<name>`` on local rank
0 of each node while the node's other ranks wait, and copies results (and, with
``upload_checkpoints``, each checkpoint) to ``results``. A subclass adds ``put``/``get``/
``exists``/``list`` and, for a remote store, its own config fields on top of :class:`LocalSsdConfig`.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import write_json
from ..errors import ConfigError, RunError
from ..interfaces import StorageBackend
from ._transfer import CheckpointPublisher, StagingReport, is_staged, publish_files, result_files, stage
from ._urls import open_storage

if TYPE_CHECKING:
    from ..interfaces import RunContext


class Verify(StrEnum):
    size = "size"
    hash = "hash"


@dataclass
class LocalSsdConfig:
    # node-local scratch directory (on Azure VMs the temporary disk, e.g. /mnt/resource/ddlkit);
    # datasets staged there are kept and reused by later jobs on the node. null: the node's scratch
    # directory that the compute target provides ($DDLKIT_NODE_SCRATCH)
    scratch: str | None = None
    # where results go: a directory (e.g. on an NFS share) or blob://container/prefix; null keeps them
    # in the job directory
    results: str | None = None
    # also copy each checkpoint to `results` as soon as it is written
    upload_checkpoints: bool = False
    # parallel transfers while staging
    workers: int = 16
    # how an already staged file is checked against the manifest: size (every file was hash-checked
    # when it was copied) or hash (re-reads everything)
    verify: Verify = Verify.size
    # GB to keep free on the scratch disk; staging refuses to start rather than fill it
    reserve_gb: float = 1.0
    # attempts per file or result upload (transient errors, exponential backoff)
    attempts: int = 5


def dataset_dirname(root: str) -> str:
    """A readable folder name unique to ``root``: ``imagenet-3f2a9c0d1e``."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", root.rstrip("/").rsplit("/", 1)[-1]) or "data"
    return f"{tail[:48]}-{hashlib.sha256(root.rstrip('/').encode()).hexdigest()[:10]}"


class StagingStorage(StorageBackend, CheckpointPublisher):
    """Shared by ``local_ssd`` and storage backends of remote object stores (``azure``): data is
    staged to node-local scratch, results are copied to :meth:`results_target`."""

    cfg: LocalSsdConfig

    def __init__(self, cfg: LocalSsdConfig) -> None:
        super().__init__(cfg)
        self.scratch = Path(cfg.scratch).expanduser() if cfg.scratch else None

    # ------------------------------------------------------------ data
    def open_source(self, root: str) -> StorageBackend:
        """The dataset ``root`` as a backend whose keys are relative to it."""
        return open_storage(root)

    def staged_path(self, root: str) -> Path:
        if self.scratch is None:
            raise ConfigError(f"data.root={root} is staged to each node's disk before training: set storage.scratch "
                              "to a local directory with room for it (on Azure VMs the temporary disk, "
                              "e.g. /mnt/resource/ddlkit); this compute target provides none.")
        return self.scratch / "datasets" / dataset_dirname(root)

    def data_path(self, root: str) -> Path:
        path = self.staged_path(root)
        if not is_staged(path):
            raise RunError(f"{root} is not staged in {path} on this node (its local rank 0 stages it in "
                           "DataSource.prepare).", component="storage")
        return path

    def stage(self, root: str) -> StagingReport:
        c = self.cfg
        return stage(self.open_source(root), self.staged_path(root), describe=root, workers=c.workers,
                     verify=c.verify, reserve_bytes=int(c.reserve_gb * 1e9),
                     attempts=c.attempts)

    def prepare_data(self, root: str, run: RunContext) -> Path:
        started = time.perf_counter()
        if self.scratch is None and run.dist.node_scratch:
            self.scratch = Path(run.dist.node_scratch)
        if run.dist.is_local_main:
            report = self.stage(root)
            what = ("already staged: 0 bytes transferred" if report.reused else
                    f"{report.files_transferred} files, {report.bytes_transferred / 1e6:.1f} MB transferred")
            print(f"ddlkit: staged {root} -> {report.destination} in {report.seconds:.1f}s ({what})", flush=True)
            write_json(run.job_dir / f"staging-node{run.dist.node}.json", report.as_dict())
        # the node's other ranks start reading only once the copy is complete
        run.dist.barrier()
        # reported apart from training time; includes waiting for the slowest node
        run.extra_result["staging_time_s"] = round(time.perf_counter() - started, 3)
        return self.data_path(root)

    # ------------------------------------------------------------ results
    def results_target(self, job_name: str) -> tuple[StorageBackend, str] | None:
        """The backend and key prefix a job's results go to; None keeps them in the job directory."""
        if not self.cfg.results:
            return None
        return open_storage(self.cfg.results), job_name

    def publish_results(self, job_dir: Path, job_name: str) -> str | None:
        target = self.results_target(job_name)
        if target is None:
            return None
        backend, prefix = target
        try:
            publish_files(job_dir, result_files(job_dir, checkpoints=True), backend, prefix, attempts=self.cfg.attempts)
        except RunError as err:
            # result.json and everything else stay in the job directory: nothing is lost
            raise RunError(f"{err}. The results are intact in {job_dir}; copy them again with "
                           f"`ddlkit data upload {job_dir} {self.describe_results(job_name)}`.",
                           component="storage") from err
        return self.describe_results(job_name)

    def describe_results(self, job_name: str) -> str:
        return f"{self.cfg.results.rstrip('/')}/{job_name}"

    def publish_checkpoint(self, job_dir: Path, job_name: str, files: list[str]) -> None:
        target = self.results_target(job_name)
        if target is not None:
            publish_files(job_dir, files, target[0], target[1], attempts=self.cfg.attempts)
