"""The sweep report: ``report.csv``, ``report.md`` and ``report.png`` in the sweep directory.

One row per job of the ledger (also the jobs a resumed sweep skipped), sorted by the chosen
metric, best first; jobs without that metric (failed, not run) come last, in job order.
"""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...atomic import atomic_path, write_text
from ...result import HEADLINE
from .halving import PAUSED, PRUNED
from .ledger import JobRecord, Ledger
from .settings import SORT_KEYS

#: the report's own columns around the result's headline fields
COLUMNS = ("job", "overrides", "status", "attempts", "restarts", "duration_s", *(f.name for f in HEADLINE), "job_dir")
#: early stopping's statuses, shown with the milestone the trial stopped at ("paused at 3")
STOPPED = (PAUSED, PRUNED)
#: how the Markdown table shows each numeric column
_FORMATS = {"duration_s": "{:.1f}", **{f.name: f.format for f in HEADLINE}}
_TITLES = {"duration_s": "duration (s)", **{f.name: f.title for f in HEADLINE}, "job_dir": "directory"}


@dataclass(frozen=True)
class Report:
    rows: list[dict[str, Any]]
    csv: Path
    markdown: Path
    #: None when matplotlib is not installed
    png: Path | None


def varying_overrides(records: Sequence[JobRecord]) -> dict[int, str]:
    """Each job's overrides of the keys whose values differ between jobs: what tells the jobs apart."""
    present = [dict(o.partition("=")[::2] for o in rec.overrides) for rec in records]
    # a key set in some jobs only (+group=x) varies too: .get gives None where it is missing
    keys = {key for p in present for key in p}  # each key once: the sets below are O(jobs) each, not per job
    varying = {key for key in keys if len({p.get(key) for p in present}) > 1}
    return {rec.num: " ".join(o for o in rec.overrides if o.partition("=")[0] in varying) for rec in records}


def rows(ledger: Ledger, sort_by: str) -> list[dict[str, Any]]:
    records = [ledger.jobs[n] for n in sorted(ledger.jobs)]
    labels = varying_overrides(records)
    table = []
    for rec in records:
        result = rec.result or {}
        job_dir = Path(rec.job_dir)
        table.append(
            {
                "job": rec.num,
                "overrides": labels[rec.num],
                "status": rec.status
                + (f" at {max(map(int, rec.rung_values))}" if rec.status in STOPPED and rec.rung_values else ""),
                "attempts": rec.attempts,
                "restarts": rec.restarts,
                "duration_s": round(rec.duration_s, 3) if rec.duration_s is not None else None,
                **{f.name: result.get(f.name) for f in HEADLINE},
                "job_dir": str(job_dir.relative_to(ledger.path.parent))
                if job_dir.is_relative_to(ledger.path.parent)
                else str(job_dir),
            }
        )
    larger_first = SORT_KEYS[sort_by]
    with_metric = [r for r in table if r[sort_by] is not None]
    with_metric.sort(key=lambda r: (-r[sort_by] if larger_first else r[sort_by], r["job"]))
    return with_metric + [r for r in table if r[sort_by] is None]


def markdown(table: Sequence[dict[str, Any]], title: str) -> str:
    def cell(col: str, value: Any) -> str:
        if value is None:
            return "-"
        if col in _FORMATS:
            return _FORMATS[col].format(value)
        return str(value).replace("|", "\\|") if col == "overrides" else str(value)

    numeric = [c in _FORMATS or c in ("job", "attempts", "restarts") for c in COLUMNS]
    lines = [
        f"# {title}",
        "",
        "| " + " | ".join(_TITLES.get(c, c) for c in COLUMNS) + " |",
        "|" + "|".join("---:" if right else "---" for right in numeric) + "|",
    ]
    lines += ["| " + " | ".join(cell(c, row[c]) for c in COLUMNS) + " |" for row in table]
    return "\n".join(lines) + "\n"


def write_report(ledger: Ledger, sort_by: str) -> Report:
    return _write(rows(ledger, sort_by), ledger.path.parent, ledger.name, sort_by, ledger)


class LiveReport:
    """Rewrites the report in a background thread as jobs end, so that a running sweep's report
    is current, and so that the final one costs little: the plot library is loaded by then
    (importing matplotlib takes ~0.7 s, which the end of the sweep would otherwise wait for).

    A job's end only marks the report out of date: the thread builds the table from the ledger
    when it writes, at most once every :attr:`SETTLE_S` and never more often than ten times the
    last write took -- so the report of an N-job sweep costs O(N) per write, not per job end,
    and the launcher no time at all. The final report (:meth:`close`) is built in the caller."""

    #: seconds at least between two writes
    SETTLE_S = 0.5

    def __init__(self, sort_by: str) -> None:
        self.sort_by = sort_by
        self._pending: Ledger | None = None
        self._closed = False
        self._pause = self.SETTLE_S
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="ddlkit-sweep-report", daemon=True)
        self._thread.start()

    def update(self, ledger: Ledger) -> None:
        with self._cond:
            self._pending = ledger
            self._cond.notify()

    def close(self, ledger: Ledger) -> Report:
        """Wait for the thread, then write the final report here (its errors are raised)."""
        with self._cond:
            self._closed, self._pending = True, None
            self._cond.notify()
        self._thread.join()
        return write_report(ledger, self.sort_by)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                # a job's end is when the scheduler starts the next job: let it do that first
                # (this thread would take the interpreter from it), and let ends close together collapse
                self._cond.wait_for(lambda: self._closed, timeout=self._pause)
                if self._closed:
                    return
                ledger, self._pending = self._pending, None
            started = time.perf_counter()
            try:
                write_report(ledger, self.sort_by)
            except Exception:  # an interim report (read while jobs change); close() writes the final one
                pass
            self._pause = max(self.SETTLE_S, 10 * (time.perf_counter() - started))


def compute_trained(ledger: Ledger, nums: Sequence[int] | None = None) -> str:
    """Under early stopping: how much of the compute of every trial run to its end the sweep's
    trials took (of jobs ``nums``; all by default)."""
    rule = ledger.early_stopping or {}
    records = [ledger.jobs[n] for n in (nums if nums is not None else sorted(ledger.jobs))]
    used = sum(max(map(int, r.rung_values or {}), default=0) for r in records)
    full = rule["milestones"][-1] * len(records)
    return (
        f"early stopping ({rule['rule']}) trained {used} of the {full} {rule['unit']} that every trial "
        f"to its end takes ({used / full:.0%})"
    )


def _write(table: list[dict[str, Any]], sweep_dir: Path, name: str, sort_by: str, ledger: Ledger) -> Report:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    write_text(sweep_dir / "report.csv", buffer.getvalue())
    order = "largest" if SORT_KEYS[sort_by] else "smallest"
    jobs = "1 job" if len(table) == 1 else f"{len(table)} jobs"
    text = markdown(table, f"Sweep {name}: {jobs}, by {sort_by} ({order} first)")
    if ledger.early_stopping:
        curves_png = curves(ledger, sweep_dir / CURVES_PNG, f"Sweep {name}")
        text += f"\n{compute_trained(ledger).capitalize()}." + (
            f" Each trial's curve and where it stopped: {CURVES_PNG}.\n" if curves_png else "\n"
        )
    write_text(sweep_dir / "report.md", text)
    png = plot(table, sort_by, sweep_dir / "report.png", f"Sweep {name}")
    return Report(table, sweep_dir / "report.csv", sweep_dir / "report.md", png)


def plot(table: Sequence[dict[str, Any]], metric: str, path: Path, title: str) -> Path | None:
    """A horizontal bar per job (in the table's order, best on top); jobs without the metric are labelled."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    labels = [_short(f"#{r['job']} {r['overrides']}") for r in table]
    values = [r[metric] if r[metric] is not None else 0.0 for r in table]
    fig = Figure(figsize=(8, 1.2 + 0.35 * max(len(table), 1)), layout="constrained")
    ax = fig.subplots()
    positions = list(range(len(table)))[::-1]
    bars = ax.barh(positions, values, color=["tab:blue" if r[metric] is not None else "none" for r in table])
    for bar, row in zip(bars, table, strict=True):
        note = _FORMATS[metric].format(row[metric]) if row[metric] is not None else row["status"]
        ax.annotate(
            note,
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(positions, labels, fontsize=8)
    ax.set_xlabel(_TITLES.get(metric, metric))
    ax.set_title(f"{title}: {_TITLES.get(metric, metric)} per job", fontsize=10)
    # bars grow from 0; room on the right for the labels (and a visible axis when every value is 0)
    ax.set_xlim(min(0.0, *values), (max(0.0, *values) or 1.0) * 1.2)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return path


#: under early stopping: each trial's metric at its milestones, and where it stopped
CURVES_PNG = "report_curves.png"
_MARKERS = {"completed": ("o", "reached the full budget"), PAUSED: ("D", "paused"), PRUNED: ("x", "pruned")}


def curves(ledger: Ledger, path: Path, title: str) -> Path | None:
    """Each trial's metric at the milestones it reached (the values early stopping compared), its
    last point marked by how it ended."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    rule = ledger.early_stopping or {}
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    shown: set[str] = set()
    for num, rec in sorted(ledger.jobs.items()):
        points = sorted((int(at), value) for at, value in (rec.rung_values or {}).items())
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        (line,) = ax.plot(xs, ys, alpha=0.7, linewidth=1)
        marker, meaning = _MARKERS.get(rec.status, ("s", rec.status))
        label = None if rec.status in shown else meaning  # one legend entry per way of ending
        ax.plot(xs[-1:], ys[-1:], marker=marker, color=line.get_color(), linestyle="", label=label)
        shown.add(rec.status)
        ax.annotate(f"#{num}", (xs[-1], ys[-1]), xytext=(3, 0), textcoords="offset points", fontsize=7)
    ax.set_xticks(list(rule.get("milestones", [])))
    ax.set_xlabel(f"{rule.get('unit', 'budget')} trained")
    ax.set_ylabel(str(rule.get("metric", "metric")))
    ax.set_title(f"{title}: {rule.get('rule')} on {rule.get('metric')}\n{compute_trained(ledger)}", fontsize=9)
    if shown:
        ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return path


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
