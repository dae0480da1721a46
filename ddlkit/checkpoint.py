"""Where checkpoints live in a job directory and which one a run resumes from.

Layout: ``<job_dir>/checkpoints/step-00000120.ckpt`` (a file or a directory, as the framework
writes it) plus ``checkpoints/latest``, a one-line pointer replaced atomically *after* the
checkpoint itself is complete, so a crash mid-write never leaves a pointer to half a file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .atomic import write_text
from .errors import ConfigError

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.ckpt"


def latest_checkpoint(job_dir: Path) -> Path | None:
    pointer = Path(job_dir) / CHECKPOINT_DIR / LATEST
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    return path if path.exists() else None


def mark_latest(path: Path, keep: int) -> None:
    """Point ``latest`` at ``path`` and delete all but the newest ``keep`` checkpoints."""
    write_text(path.parent / LATEST, path.name + "\n")
    older = sorted(p for p in path.parent.glob("step-*.ckpt") if p.name < path.name)
    for old in older[: max(len(older) - (keep - 1), 0)]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def resolve_resume(job_dir: Path, resume: object) -> Path | None:
    """Turn ``trainer.resume`` into the checkpoint to load, or None to start fresh.

    ``auto`` (default): the job directory's latest checkpoint if there is one;
    ``true``: that checkpoint, and an error if there is none; ``false``: start fresh;
    anything else: a path to a checkpoint.
    """
    value = str(resume).strip()
    mode = value.lower()
    if mode in ("false", "no", "off", "none", "null"):
        return None
    latest = latest_checkpoint(job_dir)
    if mode == "auto":
        return latest
    if mode in ("true", "yes", "on"):
        if latest is None:
            raise ConfigError(
                f"trainer.resume=true but {job_dir}/{CHECKPOINT_DIR} holds no checkpoint. Point the run at the "
                "earlier job's directory with hydra.run.dir=<dir>, or pass trainer.resume=<path to checkpoint>."
            )
        return latest
    path = Path(value).expanduser()
    if path.is_dir() and (path / CHECKPOINT_DIR / LATEST).is_file():
        found = latest_checkpoint(path)  # a job directory was given
        if found is not None:
            return found
    if not path.exists():
        raise ConfigError(f"trainer.resume={value}: no such checkpoint. Use auto, true, false or an existing path.")
    return path.resolve()
