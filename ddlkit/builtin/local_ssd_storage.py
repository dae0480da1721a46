"""Stage the dataset onto each node's local disk before training, and send the results elsewhere.
Never train from a blob-fuse mount (too slow): stage to NFS or to local disk.

    ddlkit data=imagefolder data.root=/mnt/nfs/imagenet storage=local_ssd storage.scratch=/mnt/resource/ddlkit

Before the first step, local rank 0 of every node copies `data.root` (a directory, e.g. on an NFS
share, or `blob://container/prefix` with `ddlkit-azure` installed) into
`<storage.scratch>/datasets/<name>` while the node's other ranks wait; without `storage.scratch`
it uses the scratch directory the compute target gives each node (`$DDLKIT_NODE_SCRATCH`, e.g.
`nodes/node-K` on [compute=local_mpi](../compute/local_mpi.md)). Results go to `storage.results`
(a directory or `blob://container/prefix`) when set, and stay in the job directory otherwise
([Results](../datasets.md#results)).

## Staging

Staging (here and in [storage=azure](azure.md)) copies the files listed by the dataset's
`manifest.tsv` ([`ddlkit data manifest`](../datasets.md#prepare-and-upload-a-dataset)), in
parallel (`storage.workers`), each checked against its size and SHA-256 before it is renamed into
place. It is

- **resumable**: an interrupted staging continues where it stopped;
- **shared by the jobs of a node**: the copy survives the job, a later job with the same manifest
  transfers 0 bytes, and concurrent jobs wait for the first;
- **incremental**: only files whose hash changed are copied again;
- **careful with the disk**: it refuses to start, with the sizes, when the disk lacks room
  (keeping `storage.reserve_gb` free).

Each node writes `staging-node<N>.json` (seconds, files and bytes transferred) to the job
directory, so staging time is reported apart from training time.

## How it works

The staging is `ddlkit.storage.stage`, shared with every `StagingStorage` backend (`azure`
subclasses it). Objects (`put`/`get`) are kept in `storage.results`, or under
`<storage.scratch>/objects` when it is not set.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoint import CHECKPOINT_DIR, LATEST
from ..errors import ConfigError, RunError
from ..hookspecs import hookimpl
from ..interfaces import StorageBackend
from ..registry import Registration
from ..storage import CheckpointPublisher, LocalSsdConfig, StagingStorage, checkpoint_files, open_storage
from .local_storage import LocalStorage, LocalStorageConfig

if TYPE_CHECKING:
    from ..interfaces import RunContext


class LocalSsdStorage(StagingStorage):
    @property
    def _objects(self) -> StorageBackend:
        if self.cfg.results:
            return open_storage(self.cfg.results)
        if self.scratch is None:
            raise ConfigError(
                "storage=local_ssd keeps objects in storage.results (or under storage.scratch): set one of them."
            )
        return LocalStorage(LocalStorageConfig(root=str(self.scratch / "objects")))

    def put(self, local_path: Path, key: str) -> None:
        self._objects.put(local_path, key)

    def get(self, key: str, local_path: Path) -> None:
        self._objects.get(key, local_path)

    def exists(self, key: str) -> bool:
        return self._objects.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._objects.list(prefix)


@hookimpl
def ddlkit_storage_backends():
    yield Registration(
        "local_ssd",
        LocalSsdStorage,
        config=LocalSsdConfig,
        description="stages data to each node's local disk (from a directory or blob://); "
        "results to a directory or blob://",
    )


@hookimpl
def ddlkit_checkpoint_saved(run: RunContext, path: str) -> None:
    """Copy each checkpoint to the results location at once when ``storage.upload_checkpoints``."""
    storage = run.storage
    if not (isinstance(storage, CheckpointPublisher) and storage.cfg.upload_checkpoints):
        return
    files = checkpoint_files(run.job_dir, Path(path)) + [f"{CHECKPOINT_DIR}/{LATEST}"]
    try:
        storage.publish_checkpoint(run.job_dir, run.name, files)
    except RunError as err:
        # the checkpoint is safe in the job directory and the job goes on; the end of the job
        # copies the latest checkpoint again
        print(f"ddlkit: warning: {err}", file=sys.stderr, flush=True)
