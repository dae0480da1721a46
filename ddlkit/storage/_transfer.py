"""Moving datasets and results between storage and this machine.

* :func:`stage` copies a dataset described by its ``manifest.tsv`` into a local directory:
  in parallel, each file hash-verified before it is renamed into place (so whatever is present
  is complete), resumable after an interruption, and a no-op (0 bytes) when the copy already
  matches the manifest, which is how later jobs on the same node reuse it.
* :func:`publish_job` copies a job's results, with retries, ``result.json`` last, so that a
  result.json at the destination means everything before it arrived.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ConfigError, RunError
from ..interfaces import StorageBackend
from ..jobdir import OUTPUT_GLOBS, RESULT_FILE, RESULT_FILES, STATE_DIR
from ._manifest import MANIFEST_NAME, Entry, Manifest, sha256_file
from ._parallel import Progress, parallel, size_text
from ._retry import retry

#: the job-directory files published before the checkpoints (and result.json, always last)
RESULT_GLOBS = (*(name for name in RESULT_FILES if name != RESULT_FILE), *OUTPUT_GLOBS)


# ---------------------------------------------------------------------------- staging
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


def stage(source: StorageBackend, dest: Path, *, describe: str, workers: int = 16, verify: str = "size",
          reserve_bytes: int = 0, attempts: int = 5, live: bool | None = None) -> StagingReport:
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
            retry(lambda: source.get(MANIFEST_NAME, new_manifest), what=f"reading {describe}/{MANIFEST_NAME}",
                  attempts=attempts)
        except FileNotFoundError:
            raise ConfigError(f"{describe} has no {MANIFEST_NAME}, so it cannot be staged and verified. Write one "
                              f"with `ddlkit data manifest ROOT` (or upload with `ddlkit data upload`, which adds "
                              f"it).") from None
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
            return StagingReport(describe, str(dest), len(manifest), manifest.total_bytes, 0, 0,
                                 time.perf_counter() - t0, reused=True)
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
                "storage=nfs.")
        progress = Progress(f"staging {describe}", needed, live=live)

        def fetch(entry: Entry) -> None:
            final = dest / entry.path
            for _ in range(attempts):
                part = tmp / uuid.uuid4().hex
                retry(lambda part=part: source.get(entry.path, part), what=f"downloading {describe}/{entry.path}",
                      attempts=attempts)
                if part.stat().st_size == entry.size and sha256_file(part) == entry.sha256:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(part, final)
                    progress.advance(entry.size)
                    return
                part.unlink()
            raise RunError(f"{describe}/{entry.path} does not match its manifest entry (size {entry.size}, sha256 "
                           f"{entry.sha256[:12]}...) after {attempts} downloads: the source changed after the "
                           "manifest was written. Rewrite it with `ddlkit data manifest` (or re-upload).",
                           component="storage")

        try:
            parallel(fetch, todo, workers)
        finally:
            progress.close()
        shutil.copyfile(state / MANIFEST_NAME, tmp / MANIFEST_NAME)
        os.replace(tmp / MANIFEST_NAME, dest / MANIFEST_NAME)
        (state / "complete").write_text(manifest.digest + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
        return StagingReport(describe, str(dest), len(manifest), manifest.total_bytes, len(todo), needed,
                             time.perf_counter() - t0, reused=False)


def _present(path: Path, entry: Entry, verify: str) -> bool:
    try:
        if path.stat().st_size != entry.size:
            return False
    except FileNotFoundError:
        return False
    return verify != "hash" or sha256_file(path) == entry.sha256


# ---------------------------------------------------------------------------- results
class CheckpointPublisher(ABC):
    """A storage backend that copies each checkpoint to its results location as soon as it is
    written, when its config says ``upload_checkpoints: true``."""

    @abstractmethod
    def publish_checkpoint(self, job_dir: Path, job_name: str, files: list[str]) -> None:
        """Copy ``files`` (relative to ``job_dir``; the checkpoint, then ``checkpoints/latest``)."""


def result_files(job_dir: Path, *, checkpoints: bool) -> list[str]:
    """Relative paths of the job's results; ``result.json`` (when present) last."""
    from ..checkpoint import CHECKPOINT_DIR, LATEST, latest_checkpoint

    found = sorted({p.relative_to(job_dir).as_posix() for g in RESULT_GLOBS for p in job_dir.glob(g) if p.is_file()})
    if checkpoints:
        latest = latest_checkpoint(job_dir)
        if latest is not None:
            found += checkpoint_files(job_dir, latest) + [f"{CHECKPOINT_DIR}/{LATEST}"]
    if (job_dir / RESULT_FILE).is_file():
        found.append(RESULT_FILE)
    return found


def checkpoint_files(job_dir: Path, checkpoint: Path) -> list[str]:
    """A checkpoint's files (it is a file, or a directory the framework wrote), then its manifest if it has one."""
    from ..checkpoint import manifest_path

    files = [checkpoint] if checkpoint.is_file() else sorted(p for p in checkpoint.rglob("*") if p.is_file())
    if manifest_path(checkpoint).is_file():
        files.append(manifest_path(checkpoint))
    return [p.relative_to(job_dir).as_posix() for p in files]


def publish_files(job_dir: Path, files: Sequence[str], dest: StorageBackend, prefix: str, *, attempts: int = 5,
                  workers: int = 4) -> None:
    """Copy ``files`` (relative to ``job_dir``) to ``dest`` under ``prefix``: all but the last in
    parallel, then the last, so that the last one's presence means the others arrived."""
    if not files:
        return
    prefix = prefix.strip("/")

    def put(rel: str) -> None:
        key = f"{prefix}/{rel}" if prefix else rel
        retry(lambda: dest.put(job_dir / rel, key), what=f"uploading {rel} to {key}", attempts=attempts)

    parallel(put, list(files[:-1]), workers)
    put(files[-1])
