"""result.json's ``peak_memory_mib``: the most memory any rank of the job held (issue 41).

Each rank measures its own peak at the end of a completed run: the peak its framework allocated on
its GPU(s), where the framework reports one (``run.device_peak_memory_mib``, see
:class:`ddlkit.RunContext`), else the peak resident set size of its process
(``getrusage(RUSAGE_SELF).ru_maxrss``: the rank's process only, not the data-loading workers it
starts). Rank 0 learns the other ranks' numbers over the control plane, the way it learns the
mean loss (:meth:`ddlkit.DistContext.allgather`): no collective of the framework's, so it is the
same under every framework and ``dist``, and the gather happens where every rank already meets,
when its run completes. The job's number is the largest; ``peak_memory`` says which kind it is:
``device`` only when every rank reported its device's, else ``rss``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import DdlkitError

if TYPE_CHECKING:
    from ..interfaces.run import DistView

#: ``peak_memory``: the process's peak resident set size
RSS = "rss"
#: ``peak_memory``: the framework's peak allocated memory on the rank's GPU(s)
DEVICE = "device"

MIB = 1 << 20


def rss_peak_mib() -> float | None:
    """This process's peak resident set size in MiB, or None where the platform does not say
    (Windows has no ``resource`` module)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # KiB on Linux and the BSDs, bytes on macOS
    return peak / MIB if sys.platform == "darwin" else peak / 1024


def device_peak_mib(reported: float | Callable[[], float | None] | None) -> float | None:
    """What the framework reported as its device's peak (``run.device_peak_memory_mib``: a number,
    or a function returning one), or None when it reported none or the function failed (said on
    stderr: the process's peak is reported instead)."""
    if reported is None:
        return None
    try:
        value = reported() if callable(reported) else reported
        return None if value is None else float(value)
    except Exception as err:
        print(
            f"ddlkit: warning: the framework's peak device memory could not be read ({type(err).__name__}: {err}); "
            "result.json's peak_memory_mib is the process's peak resident set size instead",
            file=sys.stderr,
            flush=True,
        )
        return None


def peak_over_ranks(
    dist: DistView, reported: float | Callable[[], float | None] | None
) -> tuple[float | None, str | None]:
    """``(peak_memory_mib, peak_memory)`` for result.json: the largest of the ranks' peaks (a
    collective over the control plane: every rank calls it, at the end of a completed run)."""
    mine = [rss_peak_mib(), device_peak_mib(reported)]
    try:
        gathered: list[Any] = dist.allgather(mine)
    except DdlkitError as err:
        # a rank that ended or stopped answering after training completed: the result is still kept
        print(
            f"ddlkit: warning: the other ranks' peak memory is unknown ({err}); result.json's peak_memory_mib is null",
            file=sys.stderr,
            flush=True,
        )
        return None, None
    devices = [d for _, d in gathered if d is not None]
    if devices and len(devices) == len(gathered):
        return round(max(devices), 1), DEVICE
    rss = [r for r, _ in gathered if r is not None]
    return (round(max(rss), 1), RSS) if rss else (None, None)
