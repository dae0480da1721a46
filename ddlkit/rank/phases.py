"""Start-up phases: rank 0 says which one its rank has reached and when, so the minutes before
the first step (connecting, staging data, building the model) are never silent (#22)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..interfaces import DistView

#: when this module was imported: the start-up clock where /proc cannot tell the process's age
_IMPORTED = time.monotonic()


def process_age() -> float:
    """Seconds since this process started."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime", encoding="ascii") as f:
            return float(f.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


def report_phase(dist: DistView, what: str) -> None:
    """Rank 0 says which start-up phase its rank has reached and when (since the rank started)."""
    if dist.is_main:
        print(f"ddlkit: [{process_age():5.1f}s] {what}", flush=True)
