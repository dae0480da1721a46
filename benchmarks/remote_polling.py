"""How often a sweep asks a slow remote target about its jobs: calls per job per minute.

A sweep of N short jobs (the numpy fake framework, ``framework.step_delay_s`` making each last a
few seconds) runs through the real ``ddlkit -m`` on ``compute=counted`` -- ddlkit's stand-in
remote cluster (``compute=elsewhere``: a copy of the job directory, a bare environment) whose
handles count the calls the launcher makes -- once with the target's ``poll_interval_s`` at 2 s
(a remote service's pace) and once at 0.05 s (the pace every target got before: the scheduler
then also drained ``logs()`` on every look, so the old loop's calls were twice its status calls).

    python benchmarks/remote_polling.py [--jobs 20 --parallel 4 --steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_result

HERE = Path(__file__).parent


def run_sweep(work: Path, jobs: int, parallel: int, steps: int, interval: float) -> dict:
    root = work / f"cluster-{interval}"
    args = [
        "-m",
        "framework=fake",
        "data.image_size=8",
        "data.num_classes=4",
        f"data.length={steps * 8}",
        "data.val_length=16",
        "trainer.batch_size=8",
        "trainer.epochs=1",
        "trainer.log_every=50",
        "framework.step_delay_s=0.02",
        "compute=counted",
        f"compute.root={root}",
        f"compute.poll_interval_s={interval}",
        f"sweep.max_parallel={parallel}",
        f"trainer.seed={','.join(str(s) for s in range(jobs))}",
        f"hydra.sweep.dir={work / f'sweep-{interval}'}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        "DDLKIT_PLUGINS": "_counting_target,ddlkit.testing.fakes",
        "DDLKIT_STATE_DIR": str(work / "state"),
    }
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ddlkit", *args], cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    counts = [json.loads(p.read_text()) for p in sorted((root / "calls").glob("*.json"))]
    assert len(counts) == jobs, f"{len(counts)} of {jobs} jobs reported their calls"
    per_min = [60 * (c["status"] + c["logs"]) / c["watched_s"] for c in counts]
    return {
        "poll_interval_s": interval,
        "sweep_wall_s": round(wall, 2),
        "job_watched_s_median": round(statistics.median(c["watched_s"] for c in counts), 2),
        "status_calls_per_job_median": statistics.median(c["status"] for c in counts),
        "logs_calls_per_job_median": statistics.median(c["logs"] for c in counts),
        "calls_per_job_per_min_median": round(statistics.median(per_min), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ddlkit-remote-polling-"))
    try:
        remote = run_sweep(work, args.jobs, args.parallel, args.steps, 2.0)
        fast = run_sweep(work, args.jobs, args.parallel, args.steps, 0.05)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # before: every target was looked at every 0.05 s, each look one status() and one logs() call
    old = 2 * fast["calls_per_job_per_min_median"]
    payload = {
        "benchmark": "remote_polling",
        "config": vars(args),
        "remote_pace": remote,
        "local_pace": fast,
        "before_calls_per_job_per_min": old,
        "reduction": round(old / remote["calls_per_job_per_min_median"], 1),
    }
    print(json.dumps(payload, indent=2))
    print(f"wrote {write_result('remote_polling', payload)}")


if __name__ == "__main__":
    main()
