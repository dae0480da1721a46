"""Wall time of an N-job sweep: ddlkit's launcher (2 jobs in flight) against Hydra's basic launcher (serial).

Both sides run the same ``ddlkit -m`` command line through the real CLI, in one script run, on
the same N short PyTorch trainings (ResNet-18 on 32 px synthetic images, one intra-op thread
each: ``framework.num_threads=1`` and ``OMP_NUM_THREADS=1``), with ``compute=local``; only
``hydra/launcher`` differs (``basic``, or ddlkit's with ``sweep.max_parallel=2``). PyTorch
rather than the test suite's numpy fake: these are the short real runs a sweep is made of,
start-up included (importing torch is a good part of a short job). Rounds alternate the two
sides, so drift in machine load hits both alike. Goal: >= 1.8x faster on 2 cores.

Scheduling overhead per job, from the ledger's timestamps (ddlkit side):

* dispatch: from the moment the launcher saw a job end (a slot free) to the next job's process
  running (its job directory prepared, the process started);
* end seen: from the job writing result.json to the launcher seeing the job ended. Most of it
  is the worker's own interpreter exit (tearing torch down takes a second or more); the
  launcher's part is at most one poll interval (``hydra.launcher.status_interval_s``, 50 ms);
* aggregate: (sweep wall time - sum of job durations / 2) / N, i.e. everything that is not
  training in parallel, CLI start-up and the last job running alone included.

Goal: < 1 s per job.

Other processes on the machine take cores away from a sweep, and two single-threaded jobs may not
run at twice one job's speed on 2 vCPUs. Each round therefore also measures what the machine
allows at that moment: the same single-threaded PyTorch compute run alone and two at once;
``capacity`` = 2 x alone / pair time is the best ratio any launcher could reach then, and
``efficiency`` = ratio / capacity is the share of it ddlkit's launcher reached.

With ``--before REF`` each round also runs the ddlkit side on the code as it was at git REF
(exported to a temporary directory; its core and first-party plugins put first on ``PYTHONPATH``),
and the JSON gains ``before``: that wall time and the ratio before / now, so a change to the
launcher is measured against what it replaced, in the same run.

    python benchmarks/sweep.py [--jobs 6 --steps 24 --rounds 2] [--before f1fab0e]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, core_env, export, summary, write_result

from ddlkit.jobdir import RESULT_FILE


def sweep_args(jobs: int, steps: int, batch: int) -> list[str]:
    return [
        "-m",
        "framework=pytorch",
        "framework.device=cpu",
        "framework.num_threads=1",
        "model=resnet18",
        "data.image_size=32",
        "data.num_classes=10",
        f"data.length={batch * steps}",
        f"trainer.batch_size={batch}",
        "trainer.epochs=1",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.log_every=8",
        "logger=[jsonl]",
        f"trainer.seed={','.join(str(s) for s in range(1, jobs + 1))}",
    ]


CALIBRATION = """
import time, torch
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1),
                          torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64 * 32 * 32, 10))
x = torch.randn(16, 3, 32, 32)
net(x).sum().backward()
t0 = time.perf_counter()
for _ in range(40):
    net(x).sum().backward()
print(time.perf_counter() - t0)
"""


def capacity() -> dict[str, float]:
    """The speed-up two single-threaded compute processes get on this machine now, over one alone."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", CALIBRATION], env=env, stdout=subprocess.PIPE, text=True)

    alone = statistics.median(float(start().communicate()[0]) for _ in range(2))
    pair = [start(), start()]
    together = statistics.mean(float(p.communicate()[0]) for p in pair)
    return {"alone_s": alone, "pair_s": together, "capacity": 2 * alone / together}


def run_sweep(args: list[str], sweep_dir: Path, cwd: Path, core: Path | None = None) -> float:
    """Wall time of ``ddlkit ARGS``; ``core``: a checkout whose ``ddlkit`` package is used instead."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if core is not None:
        env = core_env(core, env)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit", *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"the sweep failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def overheads(sweep_dir: Path, wall: float, parallel: int) -> dict[str, Any]:
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"].values()
    ends = sorted(j["ended"] for j in jobs)
    dispatch = []
    for job in sorted(jobs, key=lambda j: j["submitted"])[parallel:]:
        # the end that freed this job's slot: the last one seen before it was submitted
        freed = max(e for e in ends if e <= job["submitted"])
        dispatch.append(job["started"] - freed)
    end_seen = [j["ended"] - (Path(j["job_dir"]) / RESULT_FILE).stat().st_mtime for j in jobs]
    busy = sum(j["duration_s"] for j in jobs)
    return {
        "dispatch_s": summary(dispatch),
        "end_seen_s": summary(end_seen),
        "aggregate_per_job_s": (wall - busy / parallel) / len(jobs),
        "job_duration_s": summary([j["duration_s"] for j in jobs]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", metavar="REF", help="also time the ddlkit side on the core at git REF")
    args = ap.parse_args()
    base = sweep_args(args.jobs, args.steps, args.batch)
    walls: dict[str, list[float]] = {"basic": [], "ddlkit": [], "before": []}
    details: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        before_core = export(args.before, cwd / "before-core") if args.before else None
        for r in range(args.rounds):
            basic_dir, ddlkit_dir = cwd / f"basic-{r}", cwd / f"ddlkit-{r}"
            machine = capacity()
            walls["basic"].append(run_sweep([*base, "hydra/launcher=basic"], basic_dir, cwd))
            walls["ddlkit"].append(run_sweep([*base, "sweep.max_parallel=2"], ddlkit_dir, cwd))
            if before_core is not None:
                walls["before"].append(
                    run_sweep([*base, "sweep.max_parallel=2"], cwd / f"before-{r}", cwd, before_core)
                )
                print(f"round {r + 1}: ddlkit launcher at {args.before} {walls['before'][-1]:.1f} s", flush=True)
            details.append(
                {
                    **overheads(ddlkit_dir, walls["ddlkit"][-1], 2),
                    "machine": machine,
                    "ratio": walls["basic"][-1] / walls["ddlkit"][-1],
                }
            )
            if r == args.rounds - 1:
                timeline = json.loads((ddlkit_dir / "ledger.json").read_text())["jobs"]
            print(
                f"round {r + 1}: basic launcher {walls['basic'][-1]:.1f} s, "
                f"ddlkit launcher {walls['ddlkit'][-1]:.1f} s, ratio {details[-1]['ratio']:.2f} "
                f"(machine capacity {machine['capacity']:.2f}) "
                f"(dispatch median {details[-1]['dispatch_s']['median'] * 1000:.0f} ms, end seen median "
                f"{details[-1]['end_seen_s']['median'] * 1000:.0f} ms)",
                flush=True,
            )
            load.append(os.getloadavg()[0])
    b, d = summary(walls["basic"]), summary(walls["ddlkit"])
    ratio = b["median"] / d["median"]
    dispatch = [s for r in details for s in r["dispatch_s"]["samples"]]
    end_seen = [s for r in details for s in r["end_seen_s"]["samples"]]
    aggregate = statistics.median(r["aggregate_per_job_s"] for r in details)
    cap = statistics.median(r["machine"]["capacity"] for r in details)
    path = write_result(
        "sweep",
        {
            "benchmark": "sweep",
            "config": vars(args),
            "command": base,
            "basic_launcher_wall_s": b,
            "ddlkit_launcher_wall_s": d,
            "ratio": ratio,
            "goal_ratio": 1.8,
            "machine_capacity": cap,
            "efficiency": ratio / cap,
            "overhead_per_job_s": {
                "dispatch": summary(dispatch),
                "dispatch_max": max(dispatch),
                "end_seen": summary(end_seen),
                "end_seen_max": max(end_seen),
                "aggregate": aggregate,
            },
            "goal_overhead_per_job_s": 1.0,
            "poll_interval_s": 0.05,
            "rounds": details,
            # 1-minute load average (2 cores) before and after each round: other processes compete for the cores
            "load_average": load,
            **(
                {
                    "before": {
                        "ref": args.before,
                        "ddlkit_launcher_wall_s": summary(walls["before"]),
                        "ratio_before_over_now": statistics.median(walls["before"]) / d["median"],
                    }
                }
                if walls["before"]
                else {}
            ),
        },
    )
    png = plot(walls, timeline, ratio)
    print(
        f"ratio basic / ddlkit = {ratio:.2f}x (goal >= 1.8; the machine allowed {cap:.2f}x: efficiency "
        f"{ratio / cap:.0%}); scheduling overhead per job: dispatch median "
        f"{summary(dispatch)['median'] * 1000:.0f} ms (max {max(dispatch) * 1000:.0f} ms), end seen median "
        f"{summary(end_seen)['median'] * 1000:.0f} ms, aggregate {aggregate:.2f} s (goal < 1 s) -> {path}, {png}"
    )


def plot(walls: dict[str, list[float]], timeline: dict[str, dict[str, Any]], ratio: float) -> Path:
    """Wall times side by side, and the last ddlkit sweep's jobs over time (two slots)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1, 2))
    names = ["Hydra basic launcher\n(serial)", "ddlkit launcher\n(max_parallel=2)"]
    medians = [statistics.median(walls["basic"]), statistics.median(walls["ddlkit"])]
    left.bar(names, medians, color=["tab:gray", "tab:blue"])
    for i, key in enumerate(("basic", "ddlkit")):
        left.plot([i] * len(walls[key]), walls[key], "k.", markersize=4)
    left.set_ylabel("sweep wall time (s)")
    left.set_title(f"{len(timeline)} jobs: {ratio:.2f}x faster", fontsize=10)
    t0 = min(j["submitted"] for j in timeline.values())
    for num, job in sorted(timeline.items(), key=lambda kv: int(kv[0])):
        right.barh(int(num), job["ended"] - job["started"], left=job["started"] - t0, color="tab:blue")
        right.barh(int(num), job["started"] - job["submitted"], left=job["submitted"] - t0, color="tab:orange")
    right.invert_yaxis()
    right.set_xlabel("seconds since the first job was submitted")
    right.set_ylabel("job")
    right.set_title("ddlkit sweep: running (blue), preparing + starting (orange)", fontsize=10)
    path = RESULTS / "sweep.png"
    fig.savefig(path, dpi=100)
    return path


if __name__ == "__main__":
    main()
