"""``storage=local_ssd``: stage the dataset onto each node's local disk before training.

Before the first step, local rank 0 of every node copies ``data.root`` (a directory such as an
NFS path, or ``blob://container/prefix`` with ``ddlkit-azure`` installed) into
``<storage.scratch>/datasets/<name>``, verified against the dataset's ``manifest.tsv``, while the
node's other ranks wait at a barrier. The copy survives the job: a later job on the node that
stages the same manifest transfers nothing, and an interrupted staging resumes where it
stopped (see :func:`ddlkit.storage.stage`). Each node's staging is written to the job
directory as ``staging-node<N>.json`` (seconds, bytes, files), apart from training time.

Results go to ``storage.results`` (a directory or a ``blob://`` URL) when set; objects
(``put``/``get``) are kept there too, or under ``<scratch>/objects`` when it is not set.
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
            raise ConfigError("storage=local_ssd keeps objects in storage.results (or under storage.scratch): "
                              "set one of them.")
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
    yield Registration("local_ssd", LocalSsdStorage, config=LocalSsdConfig,
                       description="stages data to each node's local disk (from a directory or blob://); "
                                   "results to a directory or blob://")


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
