"""What a target that copies a job directory to its nodes must send for a run to resume.

A job directory holds up to ``trainer.keep_checkpoints`` rotated checkpoints, and a run resumes
from one of them: the newest that matches its manifest (:func:`ddlkit.checkpoint.resolve_resume`).
A target whose nodes get a copy of the directory (``compute=ray`` sends it through Ray's object
store on every restart) sends that one and leaves the older ones where they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..checkpoint import manifest_path, resolve_resume, rotated_checkpoints
from ..errors import ConfigError
from ..jobdir import CHECKPOINT_DIR


def resume_setting(job_file: Path) -> object:
    """The job's ``trainer.resume``, from its job file (``auto``, the default, where it has none)."""
    try:
        return json.loads(Path(job_file).read_text(encoding="utf-8"))["config"]["trainer"]["resume"]
    except (OSError, ValueError, KeyError, TypeError):
        return "auto"


def files_to_leave(job_dir: Path, resume: object) -> list[Path]:
    """The files of ``job_dir`` that a run with ``trainer.resume=resume`` does not need: the rotated
    checkpoints other than the one it resumes from (verified here as the run will verify it), with
    their manifests. Empty when nothing can be left out: a fresh start, no intact checkpoint (the
    run says so itself), a checkpoint outside the directory, or no older one."""
    job_dir = Path(job_dir)
    try:
        chosen = resolve_resume(job_dir, resume, warn=lambda message: None)
    except ConfigError:
        return []
    checkpoints = job_dir / CHECKPOINT_DIR
    if chosen is None or chosen.parent.resolve() != checkpoints.resolve():
        return []
    leave = []
    for other in (p for p in rotated_checkpoints(checkpoints) if p.name != chosen.name):
        leave += [other] if other.is_file() else sorted(f for f in other.rglob("*") if f.is_file())
        leave += [m for m in (manifest_path(other),) if m.is_file()]
    return leave
