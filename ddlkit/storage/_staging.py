"""Staging: a dataset copied to each node's local disk, and the storages that read data from there.

:func:`stage` copies a dataset described by its ``manifest.tsv`` into a local directory: in
parallel, each file hash-verified before it is renamed into place (so whatever is present is
complete), resumable after an interruption, and a no-op (0 bytes) when the copy already matches
the manifest, which is how later jobs on the same node reuse it.

:class:`StagingStorage` is the base of ``storage=local_ssd`` and of storage backends for remote
object stores (``ddlkit-azure``'s ``storage=azure``): it stages ``data.root`` (a directory or a URL
that :func:`~ddlkit.storage.open_storage` resolves) into ``<scratch>/datasets/<name>`` on local rank
0 of each node while the node's other ranks wait, and copies results (and, with
``upload_checkpoints``, each checkpoint) to ``results``. A subclass adds ``put``/``get``/
``exists``/``list`` and, for a remote store, its own config fields on top of :class:`LocalSsdConfig`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import write_json
from ..errors import ConfigError, RunError
from ..interfaces import StorageBackend
from ..jobdir import STATE_DIR
from ._manifest import MANIFEST_NAME, Entry, Manifest, sha256_file
from ._parallel import Progress, parallel, size_text
from ._publish import CheckpointPublisher, publish_files, result_files
from ._retry import retry
from ._urls import open_storage

if TYPE_CHECKING:
    from ..interfaces import RunContext


@dataclass
class StagingReport:
    """What one staging did; written to the job directory as ``staging-node<N>.json``."""

    source: str
    destination: str
    files: int
    bytes: int
    files_transferred: int
    bytes_transferred: int
    seconds: float
    #: the copy already matched the manifest: nothing was transferred
    reused: bool

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


@contextlib.contextmanager
def _node_lock(path: Path, what: str) -> Iterator[None]:
    """One stager per copy on this node: concurrent jobs (a sweep) wait for the first, then
    find the copy complete."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"ddlkit: waiting for another job on this node that is staging {what}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_staged(dest: Path) -> bool:
    return (dest / STATE_DIR / "complete").is_file() and (dest / MANIFEST_NAME).is_file()


def stage(
    source: StorageBackend,
    dest: Path,
    *,
    describe: str,
    workers: int = 16,
    verify: str = "size",
    reserve_bytes: int = 0,
    attempts: int = 5,
    live: bool | None = None,
) -> StagingReport:
    """Make ``dest`` an exact copy of the dataset in ``source`` (keys relative to its root), as
    listed by the source's ``manifest.tsv``.

    A file already in ``dest`` counts as staged when its size matches the manifest (``verify=size``;
    every file was hash-checked before it was renamed into place) or its hash does (``verify=hash``).
    Refuses to start, with the sizes, when the disk holding ``dest`` lacks room for what is missing
    plus ``reserve_bytes``.
    """
    t0 = time.perf_counter()
    dest = Path(dest)
    state = dest / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    with _node_lock(state / "lock", describe):
        tmp = state / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # partial downloads of an interrupted staging
        tmp.mkdir()
        new_manifest = tmp / MANIFEST_NAME
        try:
            retry(
                lambda: source.get(MANIFEST_NAME, new_manifest),
                what=f"reading {describe}/{MANIFEST_NAME}",
                attempts=attempts,
            )
        except FileNotFoundError:
            raise ConfigError(
                f"{describe} has no {MANIFEST_NAME}, so it cannot be staged and verified. Write one "
                f"with `ddlkit data manifest ROOT` (or upload with `ddlkit data upload`, which adds "
                f"it)."
            ) from None
        manifest = Manifest.read(new_manifest)
        previous = state / MANIFEST_NAME
        if previous.is_file():
            # a file whose content changed since the last staging must not pass the size check
            old = Manifest.read(previous).by_path
            for e in manifest.entries:
                if e.path in old and old[e.path].sha256 != e.sha256:
                    (dest / e.path).unlink(missing_ok=True)
        os.replace(new_manifest, previous)
        todo = [e for e in manifest.entries if not _present(dest / e.path, e, verify)]
        if not todo and is_staged(dest):
            return StagingReport(
                describe, str(dest), len(manifest), manifest.total_bytes, 0, 0, time.perf_counter() - t0, reused=True
            )
        (state / "complete").unlink(missing_ok=True)
        needed = sum(e.size for e in todo)
        free = shutil.disk_usage(dest).free
        if needed + reserve_bytes > free:
            raise ConfigError(
                f"not enough space to stage {describe} into {dest}: {size_text(needed)} still to copy"
                f"{f' plus a reserve of {size_text(reserve_bytes)}' if reserve_bytes else ''}, "
                f"but only {size_text(free)} free (the dataset is {size_text(manifest.total_bytes)}, "
                f"{size_text(manifest.total_bytes - needed)} already staged). "
                "Free space there, point storage.scratch at a larger disk, or read the data in place with "
                "storage=nfs."
            )
        progress = Progress(f"staging {describe}", needed, live=live)

        def fetch(entry: Entry) -> None:
            final = dest / entry.path
            for _ in range(attempts):
                part = tmp / uuid.uuid4().hex
                retry(
                    functools.partial(source.get, entry.path, part),
                    what=f"downloading {describe}/{entry.path}",
                    attempts=attempts,
                )
                if part.stat().st_size == entry.size and sha256_file(part) == entry.sha256:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(part, final)
                    progress.advance(entry.size)
                    return
                part.unlink()
            raise RunError(
                f"{describe}/{entry.path} does not match its manifest entry (size {entry.size}, sha256 "
                f"{entry.sha256[:12]}...) after {attempts} downloads: the source changed after the "
                "manifest was written. Rewrite it with `ddlkit data manifest` (or re-upload).",
                component="storage",
            )

        try:
            parallel(fetch, todo, workers)
        finally:
            progress.close()
        shutil.copyfile(state / MANIFEST_NAME, tmp / MANIFEST_NAME)
        os.replace(tmp / MANIFEST_NAME, dest / MANIFEST_NAME)
        (state / "complete").write_text(manifest.digest + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
        return StagingReport(
            describe,
            str(dest),
            len(manifest),
            manifest.total_bytes,
            len(todo),
            needed,
            time.perf_counter() - t0,
            reused=False,
        )


def _present(path: Path, entry: Entry, verify: str) -> bool:
    try:
        if path.stat().st_size != entry.size:
            return False
    except FileNotFoundError:
        return False
    return verify != "hash" or sha256_file(path) == entry.sha256


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
            raise ConfigError(
                f"data.root={root} is staged to each node's disk before training: set storage.scratch "
                "to a local directory with room for it (on Azure VMs the temporary disk, "
                "e.g. /mnt/resource/ddlkit); this compute target provides none."
            )
        return self.scratch / "datasets" / dataset_dirname(root)

    def data_path(self, root: str) -> Path:
        path = self.staged_path(root)
        if not is_staged(path):
            raise RunError(
                f"{root} is not staged in {path} on this node (its local rank 0 stages it in DataSource.prepare).",
                component="storage",
            )
        return path

    def stage(self, root: str) -> StagingReport:
        c = self.cfg
        return stage(
            self.open_source(root),
            self.staged_path(root),
            describe=root,
            workers=c.workers,
            verify=c.verify,
            reserve_bytes=int(c.reserve_gb * 1e9),
            attempts=c.attempts,
        )

    def prepare_data(self, root: str, run: RunContext) -> Path:
        started = time.perf_counter()
        if self.scratch is None and run.dist.node_scratch:
            self.scratch = Path(run.dist.node_scratch)
        if run.dist.is_local_main:
            report = self.stage(root)
            what = (
                "already staged: 0 bytes transferred"
                if report.reused
                else f"{report.files_transferred} files, {report.bytes_transferred / 1e6:.1f} MB transferred"
            )
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
            raise RunError(
                f"{err}. The results are intact in {job_dir}; copy them again with "
                f"`ddlkit data upload {job_dir} {self.describe_results(job_name)}`.",
                component="storage",
            ) from err
        return self.describe_results(job_name)

    def describe_results(self, job_name: str) -> str:
        if not self.cfg.results:
            return "the job directory"  # no storage.results: they stay there
        return f"{self.cfg.results.rstrip('/')}/{job_name}"

    def publish_checkpoint(self, job_dir: Path, job_name: str, files: list[str]) -> None:
        target = self.results_target(job_name)
        if target is not None:
            publish_files(job_dir, files, target[0], target[1], attempts=self.cfg.attempts)
