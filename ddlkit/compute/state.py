"""ddlkit's state directory on the launcher's machine: ``$DDLKIT_STATE_DIR``, else
``$XDG_STATE_HOME/ddlkit``, else ``~/.local/state/ddlkit``.

The jobs index (``ddlkit jobs``) keeps its records under ``jobs/``; a compute target that must
remember something between launches (a workspace's resources, say) keeps it under a folder
named after itself. Not to be confused with a job directory's bookkeeping folder
(:data:`ddlkit.jobdir.STATE_DIR`).
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "DDLKIT_STATE_DIR"


def state_dir() -> Path:
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "ddlkit"
