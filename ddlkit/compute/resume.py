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
from ..jobdir import CHECKPOINT_DIR, JOB_FILE


def resume_setting(job_file: Path) -> object:
    """The job's ``trainer.resume``, from its job file (``auto``, the default, where it has none)."""
    try:
        return json.loads(Path(job_file).read_text(encoding="utf-8"))["config"]["trainer"]["resume"]
    except (OSError, ValueError, KeyError, TypeError):
        return "auto"


def files_to_resume(job_dir: Path, resume: object) -> tuple[list[Path], list[Path]] | None:
    """``(send, leave)``: the files of ``job_dir`` that a run with ``trainer.resume=resume`` needs --
    all but the rotated checkpoints other than the one it resumes from, verified here as the run
    will verify it -- and those others (with their manifests). None when there is nothing to leave
    out: a fresh start, no intact checkpoint (the run says so itself), or one outside the directory."""
    job_dir = Path(job_dir)
    try:
        chosen = resolve_resume(job_dir, resume, warn=lambda message: None)
    except ConfigError:
        return None
    checkpoints = job_dir / CHECKPOINT_DIR
    if chosen is None or chosen.parent.resolve() != checkpoints.resolve():
        return None
    others = [p for p in rotated_checkpoints(checkpoints) if p.name != chosen.name]
    if not others:
        return None
    left = {*others, *(manifest_path(p) for p in others)}
    send, leave = [], []
    for path in sorted(job_dir.rglob("*")):
        if path.is_file():
            (leave if path in left or any(parent in left for parent in path.parents) else send).append(path)
    return send, leave
