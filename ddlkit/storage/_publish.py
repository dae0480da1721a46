"""Publishing a job's results: copying them from the job directory to where they are kept.

:func:`publish_files` copies them with retries, the last file (``result.json`` in
:func:`result_files`' order) after all the others, so that a result.json at the destination means
everything before it arrived. A :class:`CheckpointPublisher` copies each checkpoint
(:func:`checkpoint_files`) as soon as it is written.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from ..interfaces import StorageBackend
from ..jobdir import OUTPUT_GLOBS, RESULT_FILE, RESULT_FILES
from ._parallel import parallel
from ._retry import retry

#: the job-directory files published before the checkpoints (and result.json, always last)
RESULT_GLOBS = (*(name for name in RESULT_FILES if name != RESULT_FILE), *OUTPUT_GLOBS)


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


def publish_files(
    job_dir: Path, files: Sequence[str], dest: StorageBackend, prefix: str, *, attempts: int = 5, workers: int = 4
) -> None:
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
