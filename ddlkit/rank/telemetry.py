"""Per-rank step telemetry and the straggler verdict.

Every rank times the phases of its optimizer steps: waiting for the next batch (``data``), the
framework's step (``step``: forward, backward, optimizer), and, inside it or around it, waiting for
the other ranks (``sync``: the control plane's collectives, timed there, and the framework's own
where it reports them, :meth:`StepTelemetry.waiting`). Each costs two clock readings.

In synchronous data-parallel training every rank's step takes as long as the slowest rank's:
the others wait for it in the gradient all-reduce. So a rank's *own* time per step -- its step
less the time it waited for the others -- is what tells a straggler from the ranks that wait for
it. Every ``trainer.log_every`` steps rank 0 gathers each rank's summary over the control plane
(the round trip that averages the logged loss already, not the training collectives);
:class:`StragglerWatch` then names a rank whose own time stays at least ``dist.straggler_factor``
times the median of the others' over the last ``dist.straggler_window`` steps, with the phase
that makes the difference, and says when it keeps pace again.
"""

from __future__ import annotations

import bisect
import socket
import statistics
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

#: the shortest time between two writes of the job directory's telemetry.json (rank 0's view of the ranks)
TELEMETRY_EVERY_S = 2.0
#: this rank's host, as the telemetry names it
HOST = socket.gethostname()
#: the phases a rank's step time is split into, as a summary names them
PHASES = ("data", "compute", "sync", "other")
#: how the console names them
_SAID = {"data": "data wait", "compute": "compute", "sync": "waiting for the others", "other": "other work"}
#: what a hang report says a rank is doing in each phase
_WHERE = {
    "data": "waiting for the next batch",
    "step": "the training step (forward, backward, the framework's all-reduce, the optimizer)",
    "sync": "waiting for the other ranks",
}


class StepTelemetry:
    """One rank's clock of its step phases. ``where`` says what it is doing now (the heartbeats
    carry it, so that a hang report can say which rank is not in the collective the others wait in)."""

    def __init__(self, local_batch: int, sync_clock: Any = None, *, enabled: bool = True) -> None:
        self.local_batch = local_batch
        #: dist.telemetry: off, rank 0 gathers no summaries (the clock's few microseconds a step still run:
        #: a hang report says the phase)
        self.enabled = enabled
        #: the cumulative seconds this rank waited in control-plane collectives (ControlPlane.wait_s), or None
        self.sync_clock = sync_clock
        self.where = "starting"
        self._reset()
        self._last_tick: float | None = None

    def _reset(self) -> None:
        self.steps = 0
        self.wall = self.data = self.step = self.sync = 0.0
        self._sync_mark = self._sync_total()

    def _sync_total(self) -> float:
        return float(self.sync_clock.wait_s) if self.sync_clock is not None else 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a ``data`` or ``step`` phase of the current step."""
        before, self.where = self.where, _WHERE[name]
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            if name == "data":
                self.data += elapsed
            else:
                self.step += elapsed
            self.where = before

    @contextmanager
    def waiting(self, what: str = _WHERE["sync"]) -> Iterator[None]:
        """Time a wait for the other ranks (a framework's all-reduce it can see the end of); a hang
        report says ``what`` of a rank that waits here."""
        before, self.where = self.where, what
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync += time.perf_counter() - start
            self.where = before

    def add_sync(self, seconds: float) -> None:
        """Count ``seconds`` of waiting for the other ranks (timed by the framework itself)."""
        self.sync += seconds

    def tick(self) -> None:
        """An optimizer step ended (called from ``step_end``): its wall time is the time since the
        previous one's end; a pause (validation, a checkpoint) is left out with :meth:`pause`."""
        now = time.perf_counter()
        if self._last_tick is not None:
            self.wall += now - self._last_tick
            self.steps += 1
        else:  # the first step after a start or a pause: its phases have no wall time to share
            self._reset()
        self._last_tick = now
        self.where = "between steps"

    def pause(self) -> None:
        self._last_tick = None
        self.where = "validation or checkpoint"

    def summary(self) -> dict[str, float]:
        """This rank's phases since the last summary, in seconds per step, and its images/sec;
        then the counters start again."""
        sync = self.sync + self._sync_total() - self._sync_mark
        steps = max(self.steps, 1)
        wall = self.wall
        data = min(self.data, wall)
        sync = min(sync, max(wall - data, 0.0))
        compute = min(max(self.step - sync, 0.0), max(wall - data - sync, 0.0))
        out = {
            "steps": self.steps,
            "wall": wall / steps,
            "data": data / steps,
            "compute": compute / steps,
            "sync": sync / steps,
            "other": max(wall - data - compute - sync, 0.0) / steps,
            "images_per_sec": self.local_batch * self.steps / wall if wall > 0 else 0.0,
        }
        self._reset()
        return out


def own_time(summary: Mapping[str, float]) -> float:
    """A rank's own time per step: its wall time less what it waited for the others."""
    return summary["wall"] - summary["sync"]


@dataclass
class Straggler:
    """A rank named slower than the others, from ``since`` to ``until`` (None: still is)."""

    rank: int
    node: int
    since: int
    until: int | None = None
    #: how much slower than the median of the others, in percent, at its worst
    slower_pct: float = 0.0
    #: the phase that makes the difference, and its share of the rank's own time
    phase: str = ""
    phase_share: float = 0.0
    others_share: float = 0.0


@dataclass
class StragglerWatch:
    """Rank 0's verdict on the ranks' summaries, window after window."""

    factor: float = 1.2
    window: int = 50
    nodes: Sequence[int] = ()
    #: rank -> its summaries of the recent logging windows (steps, and seconds per step by phase)
    _history: dict[int, deque] = field(default_factory=dict)
    current: dict[int, Straggler] = field(default_factory=dict)
    episodes: list[Straggler] = field(default_factory=list)

    def observe(self, step: int, summaries: Sequence[Mapping[str, float]]) -> list[str]:
        """Take every rank's summary of the window that ended at ``step``; return what to say."""
        said: list[str] = []
        for rank, s in enumerate(summaries):
            if s.get("steps", 0) > 0:
                self._history.setdefault(rank, deque()).append(dict(s))
                self._trim(self._history[rank])
        if len(summaries) < 2:
            return said
        totals = {rank: _total(h) for rank, h in self._history.items()}
        if not totals or min(t["steps"] for t in totals.values()) < self.window / 2:
            return said  # too few steps yet to judge: a rank's first steps are its slowest
        # each rank against the median of the others: one sort, then each rank's own value left out
        ordered = sorted(own_time(t) for t in totals.values())
        for rank, mine in totals.items():
            median = _median_without(ordered, own_time(mine))
            ratio = own_time(mine) / median if median > 0 else 1.0
            named = self.current.get(rank)
            if named is None and ratio >= self.factor:
                phase, share, others_share = _culprit(mine, [t for r, t in totals.items() if r != rank])
                named = Straggler(
                    rank,
                    self._node(rank),
                    step,
                    slower_pct=round((ratio - 1) * 100, 1),
                    phase=phase,
                    phase_share=share,
                    others_share=others_share,
                )
                self.current[rank] = named
                self.episodes.append(named)
                said.append(self.line(named, steps=int(mine["steps"])))
            elif named is not None:
                named.slower_pct = max(named.slower_pct, round((ratio - 1) * 100, 1))
                # it keeps pace again once well below the factor: no flapping around it
                if ratio < 1 + (self.factor - 1) / 2:
                    named.until = step
                    del self.current[rank]
                    said.append(f"ddlkit: rank {rank} keeps pace with the others again (step {step})")
        return said

    def _trim(self, history: deque) -> None:
        while len(history) > 1 and sum(s["steps"] for s in list(history)[1:]) >= self.window:
            history.popleft()

    def _node(self, rank: int) -> int:
        return self.nodes[rank] if rank < len(self.nodes) else 0

    def line(self, s: Straggler, *, steps: int) -> str:
        return (
            f"ddlkit: rank {s.rank} on node {s.node} is {s.slower_pct:.0f} % slower than the median of the others "
            f"over the {steps} steps to step {s.since}: {_SAID[s.phase]} is {s.phase_share:.0%} of its time per "
            f"step (the others' {s.others_share:.0%})"
        )

    def record(self) -> list[dict[str, Any]]:
        """result.json's ``stragglers``: every episode, the current ones with ``until`` None."""
        return [asdict(s) for s in self.episodes]


def _median_without(ordered: list[float], value: float) -> float:
    """The median of the sorted ``ordered`` with one occurrence of ``value`` left out."""
    i = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(k: int) -> float:  # the k-th of the others
        return ordered[k if k < i else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _total(history: deque) -> dict[str, float]:
    """Seconds per step by phase over the windows in ``history``, weighted by their steps."""
    steps = sum(s["steps"] for s in history)
    out = {"steps": steps}
    for key in ("wall", *PHASES):
        out[key] = sum(s[key] * s["steps"] for s in history) / steps if steps else 0.0
    return out


def _culprit(mine: Mapping[str, float], others: Sequence[Mapping[str, float]]) -> tuple[str, float, float]:
    """The phase of its own time in which a straggler spends the most more than the others do (the
    median of theirs), its share of the straggler's own time and the others' share of theirs."""
    candidates = ("data", "compute", "other")
    excess = {p: mine[p] - statistics.median(o[p] for o in others) for p in candidates}
    phase = max(excess, key=lambda p: excess[p])
    own = own_time(mine) or 1.0
    others_share = statistics.median(o[phase] / (own_time(o) or 1.0) for o in others)
    return phase, mine[phase] / own, others_share


def rank_table(ranks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per rank of the gathered telemetry (``{"t": summary, "node": ..., "host": ...}``):
    its images/sec, data wait and sync wait as shares of its step time, and its own ms per step."""
    rows = []
    for rank, r in enumerate(ranks):
        s, wall = r["t"], r["t"]["wall"] or 1.0
        rows.append(
            {
                "rank": rank,
                "node": r["node"],
                "host": r["host"],
                "images_per_sec": round(s["images_per_sec"], 2),
                "data_wait": round(s["data"] / wall, 4),
                "sync_wait": round(s["sync"] / wall, 4),
                "own_ms": round(own_time(s) * 1000, 3),
            }
        )
    return rows
