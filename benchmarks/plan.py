"""``ddlkit plan -m optimizer.lr=range(1,N+1)``: wall time and peak memory for N = 10 ... 10,000 jobs.

Each size runs the real CLI in a fresh process (the default run: PyTorch, ResNet-18, synthetic
data, ``compute=local``), which expands the sweep, composes and validates every job and prints
each job's plan, running nothing. Peak memory is the process's maximum resident set size.

With ``--before REF`` the same command also runs on the code as it was at git REF (exported to
a temporary directory; its core and first-party plugins put first on ``PYTHONPATH``, as in
``benchmarks/sweep.py``), alternating with the current code size by size, so machine load hits
both alike. Sizes whose run on the old code would take longer than ``--before-limit-s`` (going by
the per-job time of the sizes below) are not run there, and are marked so in the JSON.

The per-job cost is the slope between the two largest sizes run: what one more job adds.

    python benchmarks/plan.py [--sizes 10 100 1000 10000] [--before HEAD] [--before-limit-s 600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import write_result
from sweep import export

#: runs the command given as arguments and prints its wall time and the child's peak RSS (kB), as JSON
_MEASURE = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "returncode": proc.returncode, "last_line": (proc.stdout.strip().splitlines() or [""])[-1],
                  "stderr": proc.stderr[-2000:]}))
"""


def plan_once(jobs: int, cwd: Path, core: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if core is not None:
        paths = [str(core), *(str(p) for p in sorted(core.glob("plugins/*/src")))]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "ddlkit",
        "plan",
        "-m",
        f"optimizer.lr=range(1,{jobs + 1})",
        f"hydra.sweep.dir={cwd / f'plan-{jobs}'}",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    measured = json.loads(proc.stdout)
    expected = f"ddlkit plan: all {jobs} jobs are valid; nothing was run."
    if measured["returncode"] != 0 or measured["last_line"] != expected:
        raise RuntimeError(
            f"the plan of {jobs} jobs failed ({measured['returncode']}): {measured['last_line']}\n{measured['stderr']}"
        )
    return {"wall_s": round(measured["wall_s"], 3), "peak_rss_mb": round(measured["peak_rss_mb"], 1)}


def per_job_s(runs: dict[int, dict[str, Any]]) -> float | None:
    sizes = sorted(n for n, r in runs.items() if "wall_s" in r)
    if len(sizes) < 2:
        return None
    small, large = sizes[-2:]
    return round((runs[large]["wall_s"] - runs[small]["wall_s"]) / (large - small), 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--before", metavar="REF", help="also plan on the code at git REF")
    ap.add_argument(
        "--before-limit-s",
        type=float,
        default=600.0,
        help="skip a size on the old code when it would take longer than this",
    )
    args = ap.parse_args()
    now: dict[int, dict[str, Any]] = {}
    before: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ddlkit-plan-bench-") as tmp:
        cwd = Path(tmp)
        before_core = export(args.before, cwd / "before-core") if args.before else None
        for jobs in sorted(args.sizes):
            load = os.getloadavg()[0]
            now[jobs] = {**plan_once(jobs, cwd, None), "load_1min": round(load, 2)}
            print(f"now:    {jobs:6d} jobs {now[jobs]['wall_s']:8.2f} s {now[jobs]['peak_rss_mb']:7.1f} MB", flush=True)
            if before_core is None:
                continue
            slope = per_job_s(before) or (before[min(before)]["wall_s"] / min(before) if before else 0.0)
            predicted = slope * jobs
            if predicted > args.before_limit_s:
                before[jobs] = {"skipped": f"predicted {predicted:.0f} s > --before-limit-s {args.before_limit_s:.0f}"}
                print(f"before: {jobs:6d} jobs skipped ({before[jobs]['skipped']})", flush=True)
                continue
            before[jobs] = {**plan_once(jobs, cwd, before_core), "load_1min": round(os.getloadavg()[0], 2)}
            print(
                f"before: {jobs:6d} jobs {before[jobs]['wall_s']:8.2f} s {before[jobs]['peak_rss_mb']:7.1f} MB",
                flush=True,
            )
    payload: dict[str, Any] = {
        "benchmark": "plan",
        "command": "ddlkit plan -m optimizer.lr=range(1,N+1)",
        "note": "taken on the shared 2-core development machine while other work ran (see load_1min)",
        "now": {"runs": {str(n): r for n, r in now.items()}, "per_job_s": per_job_s(now)},
    }
    if before:
        payload["before"] = {
            "ref": args.before,
            "runs": {str(n): r for n, r in before.items()},
            "per_job_s": per_job_s(before),
        }
        payload["speedup"] = {
            str(n): round(before[n]["wall_s"] / now[n]["wall_s"], 1) for n in now if "wall_s" in before.get(n, {})
        }
    print(f"results: {write_result('plan', payload)}")


if __name__ == "__main__":
    main()
