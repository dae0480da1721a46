"""A job's secrets for ranks that share the launcher's disk, in a file instead of the scheduler's
environment: Slurm keeps a batch job's environment in its spool (``StateSaveLocation``), where the
secrets outlived the job; the file is the job user's alone (mode 0600), the ranks' entry reads it
into the environment it starts the worker with, and it is removed when the job ends.

::

    secret_file.write(job_dir, spec.secret_env)     # the target's submit, before the scheduler sees the job
    variables |= secret_file.read(Path.cwd())       # the rank entry, in the job directory
    secret_file.remove(job_dir)                     # the job is over (the launcher's settle; the batch script)

Standard library only: the rank entries import it before the worker starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..jobdir import STATE_DIR

__all__ = ["SECRETS_FILE", "read", "remove", "write"]

#: relative to the job directory
SECRETS_FILE = f"{STATE_DIR}/secrets.json"


def write(job_dir: Path, secret_env: Mapping[str, str], name: str = SECRETS_FILE) -> None:
    """``secret_env`` into the job's secrets file (``name``, relative to ``job_dir``), created
    readable by its user alone (none: no file)."""
    path = Path(job_dir) / name
    path.unlink(missing_ok=True)
    if not secret_env:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(dict(secret_env), f)
    partial.rename(path)


def read(job_dir: Path, name: str = SECRETS_FILE) -> dict[str, str]:
    """The job's secret environment (nothing when it has none)."""
    try:
        return {str(k): str(v) for k, v in json.loads((Path(job_dir) / name).read_text("utf-8")).items()}
    except FileNotFoundError:
        return {}


def remove(job_dir: Path, name: str = SECRETS_FILE) -> None:
    (Path(job_dir) / name).unlink(missing_ok=True)
