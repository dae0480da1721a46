"""benchmarks/index.md and a page per result file (benchmarks/results/<name>.json): when it was
measured, on what machine, its ratios, its plot and how the benchmark measures."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from .source import ROOT, markdown
from .tables import cell

RESULTS = ROOT / "benchmarks" / "results"
#: the keys of a result that compare two things: ratios, speed-ups, efficiencies, reductions, x_over_y, x_vs_y
_RATIO = re.compile(r"(^|[_\s])(ratios?|speedup|efficiency|reduction)([_\s]|$)|_over_|_vs_", re.IGNORECASE)


def date(path: Path) -> str:
    """When a result was measured: the date of the commit that last changed its file (git), else the
    file's own date."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%cs", "--", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out:
        return out
    import datetime

    return datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()


def _leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, (*path, str(key)))]
    return [(path, node)]


def ratios(result: dict[str, Any]) -> list[tuple[str, float]]:
    """Every number of a result whose key says it compares (``ratio``, ``speedup``, ``efficiency``,
    ``reduction``, ``x_over_y``, ``x_vs_y``, or below such a key), with its dotted key."""
    found = []
    for path, value in _leaves({k: v for k, v in result.items() if k not in ("machine", "machine_gpu")}):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and any(_RATIO.search(p) for p in path):
            found.append((".".join(path), value))
    return found


def machine(result: dict[str, Any]) -> str:
    m, gpu = result.get("machine") or {}, result.get("machine_gpu") or {}
    parts = []
    if gpu.get("gpu"):
        parts.append(str(gpu["gpu"]))
    if m.get("cpus"):
        parts.append(f"{m['cpus']} CPUs")
    if m.get("platform"):
        parts.append(str(m["platform"]))
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    return ", ".join(parts)


def script(stem: str, result: dict[str, Any]) -> Path | None:
    """The benchmark script that wrote a result: ``benchmarks/<benchmark>.py``, or the one whose
    text names the result's file."""
    named = ROOT / "benchmarks" / f"{result.get('benchmark') or stem}.py"
    if named.is_file():
        return named
    for candidate in sorted((ROOT / "benchmarks").glob("*.py")):
        text = candidate.read_text(encoding="utf-8")
        if f"{stem}.json" in text:
            return candidate
    return None


def _script_doc(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return markdown(doc)


def _number(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(f"- {markdown(str(v))}" for v in value)
    if isinstance(value, dict):
        return "\n".join(f"- **{k}**: {markdown(str(v))}" for k, v in value.items())
    return markdown(str(value))


def pages() -> dict[str, str | bytes]:
    """benchmarks/index.md, benchmarks/<name>.md, and each result's JSON and plot beside its page."""
    out: dict[str, str | bytes] = {}
    index = [
        "# Benchmarks",
        "",
        "ddlkit's measurements, one page per result file in `benchmarks/results/` (written by the scripts "
        "in `benchmarks/`; each page says how its script measures). Dates are those of the commit that "
        "last changed the result. Ratios compare ddlkit with the hand-written or native alternative, or a "
        "run with its own earlier self; most were measured on a shared 2-core machine.",
        "",
        "| Benchmark | Date | Machine | Ratios |",
        "| --- | --- | --- | --- |",
    ]
    for path in sorted(RESULTS.glob("*.json")):
        stem = path.stem
        result = json.loads(path.read_text(encoding="utf-8"))
        when, where, found = date(path), machine(result), ratios(result)
        shown = ", ".join(f"`{k}` {_number(v)}" for k, v in found[:3]) + (", ..." if len(found) > 3 else "")
        index.append(f"| [{stem}]({stem}.md) | {when} | {cell(where)} | {cell(shown) or '-'} |")
        page = [f"# {stem}", "", f"Measured: **{when}** on {where or 'an unrecorded machine'}.", ""]
        for key in ("what", "note", "notes", "command", "endpoint"):
            if key in result:
                page += [f"**{key.capitalize()}**:", "", _text(result[key]), ""]
        page += ["## Ratios", ""]
        if found:
            page += ["| Key | Value |", "| --- | --- |", *(f"| `{k}` | {_number(v)} |" for k, v in found), ""]
        else:
            page += ["This result records no ratios; its numbers are in the raw data below.", ""]
        plot = path.with_suffix(".png")
        if plot.is_file():
            out[f"benchmarks/{stem}.png"] = plot.read_bytes()
            page += ["## Plot", "", f"![{stem}]({stem}.png)", ""]
        out[f"benchmarks/{stem}.json"] = path.read_bytes()
        page += [
            "## Raw data",
            "",
            f"[{stem}.json]({stem}.json): every number, with the samples behind the medians.",
            "",
        ]
        source = script(stem, result)
        if source is not None:
            page += ["## How it is measured", "", f"`benchmarks/{source.name}`:", "", _script_doc(source), ""]
        out[f"benchmarks/{stem}.md"] = "\n".join(page)
    out["benchmarks/index.md"] = "\n".join(index) + "\n"
    return out
