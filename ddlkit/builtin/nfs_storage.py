"""A file share mounted at the same path on every node (the reference architecture's NFS file
server). Data is read in place from the share; results go to `<storage.root>/results/<job>` on
the share when the job ends (nothing to copy when the job directory is already on it). Mount the
share at `storage.root` on every node first.

    ddlkit data=imagefolder data.root=/mnt/nfs/imagenet storage=nfs storage.root=/mnt/nfs

A relative `data.root` is read below `storage.root`. On [compute=batchai](../compute/batchai.md)
the share is the file server ddlkit creates: `storage.root='$AZ_BATCHAI_MOUNT_ROOT/nfs'`, expanded
on the nodes. How results are copied, and what happens when a copy fails:
[Datasets, staging and results](../datasets.md#results).

## How it works

Objects (`put`/`get`) are files under `root`, as with `storage=local`; results are published with
`ddlkit.storage.publish_files` (`result.json` last), and with `storage.upload_checkpoints=true`
each checkpoint as soon as it is written (`CheckpointPublisher`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING

from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..registry import Registration
from ..storage import CheckpointPublisher, is_url, publish_files, result_files
from .local_storage import LocalStorage


@dataclass
class NfsStorageConfig:
    # where the share is mounted on every node, e.g. /mnt/nfs; a relative data.root is read below it
    root: str = MISSING
    # results go to <root>/<results>/<job> unless the job directory is already on the share
    results: str = "results"
    # also copy each checkpoint to the share as soon as it is written
    upload_checkpoints: bool = False


class NfsStorage(LocalStorage, CheckpointPublisher):
    def __init__(self, cfg: NfsStorageConfig) -> None:
        super().__init__(cfg)
        # $VARS expand on the node: a cluster's mount point may be known only there
        # (compute=batchai: storage.root='$AZ_BATCHAI_MOUNT_ROOT/nfs')
        self.root = Path(os.path.expandvars(cfg.root)).expanduser()

    def _mounted_root(self) -> Path:
        if not self.root.is_dir():
            raise ConfigError(f"storage.root={self.root} does not exist on this node: is the NFS share mounted there?")
        return self.root

    def launch_relative(self, root: str, launch_dir: Path) -> str:
        # a relative data.root is the share's: below storage.root, the mount point every node has.
        # Made absolute here, so that what lists the dataset before the storage reads it (the
        # image folder's index, built with the run) finds it too
        if is_url(root) or Path(root).expanduser().is_absolute():
            return root
        return str(self.root / root)

    def data_path(self, root: str) -> Path:
        if is_url(root):
            raise ConfigError(
                f"storage=nfs reads data in place and cannot read data.root={root}; stage it to each "
                "node's disk with storage=local_ssd, or copy it onto the share."
            )
        path = self._mounted_root() / Path(root).expanduser()  # an absolute data.root replaces the mount point
        if not path.is_dir():
            raise ConfigError(f"data.root {path} is not a directory on the share mounted at {self.root}.")
        return path

    def _results_prefix(self, job_dir: Path, job_name: str) -> str | None:
        """The key prefix results go under, or None when the job directory is on the share already."""
        on_share = self._mounted_root().resolve() in Path(job_dir).resolve().parents
        return None if on_share else f"{self.cfg.results.strip('/')}/{job_name}"

    def publish_results(self, job_dir: Path, job_name: str) -> str | None:
        prefix = self._results_prefix(job_dir, job_name)
        if prefix is None:
            return str(job_dir)
        publish_files(job_dir, result_files(job_dir, checkpoints=True), self, prefix)
        return str(self.root / prefix)

    def publish_checkpoint(self, job_dir: Path, job_name: str, files: list[str]) -> None:
        prefix = self._results_prefix(job_dir, job_name)
        if prefix is not None:
            publish_files(job_dir, files, self, prefix)


@hookimpl
def ddlkit_storage_backends():
    yield Registration(
        "nfs",
        NfsStorage,
        config=NfsStorageConfig,
        description="a share mounted on every node: data read in place, results written to it",
    )
