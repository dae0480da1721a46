"""Start-up phases: rank 0 says which one its rank has reached and when, so the minutes before
the first step (connecting, staging data, building the model) are never silent (#22), and every
rank records them, with the ones it does not say (the worker started, the framework imported), for
result.json's ``startup_s``: where the time to the first step went (#29)."""

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


#: this process's start-up phases as they were reached: name -> seconds since the process started
RECORDED: dict[str, float] = {}


def record_phase(what: str) -> float:
    """Record that this process reached start-up phase ``what`` (its first time only; the name
    before any " (" detail: "model built (11.7M parameters)" is "model built"); return its age."""
    age = process_age()
    RECORDED.setdefault(what.split(" (", 1)[0], round(age, 3))
    return age


def report_phase(dist: DistView, what: str, name: str | None = None) -> None:
    """Record a start-up phase (as ``name``, by default ``what``); rank 0 also says which one its
    rank has reached and when (since the rank started)."""
    age = record_phase(name or what)
    if dist.is_main:
        print(f"ddlkit: [{age:5.1f}s] {what}", flush=True)


def startup() -> dict[str, float]:
    """result.json's ``startup_s``: when this process started (Unix time, ``started_at``), then
    each phase it recorded, in seconds since then."""
    return {"started_at": round(time.time() - process_age(), 3), **RECORDED}
