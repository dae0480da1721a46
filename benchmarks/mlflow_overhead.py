"""What logging to MLflow costs a training job: the same PyTorch job with ``logger=[console]`` and with
``logger=[console,mlflow]`` against a live ``mlflow server`` this script starts (SQLite store, on this
machine), in one process, rounds alternating so machine drift hits every side alike.

The mlflow side runs twice per round: with MLflow's asynchronous logging (the default,
``logger.mlflow.async_logging=true``) and with every call waiting for the server (``false``). Every
step is logged (``trainer.log_every=1``, the worst case; the default logs every 10th). Throughput is
ddlkit's own ``images_per_sec`` (steady state, after warm-up); the run's start (experiment, run,
params) and end (flush, result.json, status) are outside it and show in ``wall_time_s``.
Goal: async ratio (mlflow over console, images/sec) >= 0.99.

On a shared machine images/sec swings with the other work, by far more than 1%: the benchmark also
reports the process's CPU seconds per image (``time.process_time`` around each job: the training
thread, MLflow's background threads, everything the job costs this process; the server's own work
is another process, as it would be another machine), which other processes disturb much less, and
``cpu_ratio`` (console's CPU per image over mlflow's: 1.0 is free, 0.99 is 1% more CPU). PyTorch
runs one intra-op thread, so that CPU seconds count work, not spinning; one job is run and dropped
first (imports, allocator warm-up). ``quiet``: 3 rounds or more, and the machine's 1-minute load
average below 0.5 as the benchmark started (the rounds' own load is recorded beside it).

    python benchmarks/mlflow_overhead.py [--model resnet18 --image-size 32 --batch 32 --steps 80 --rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

# one intra-op thread (set before torch is imported by the first job)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from _common import make_job, run_worker, summary, write_result  # noqa: E402

from ddlkit_mlflow.testing import MlflowServer  # noqa: E402

SIDES = ("console", "mlflow_async", "mlflow_sync")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    common = [
        "framework=pytorch",
        f"model={args.model}",
        f"data.image_size={args.image_size}",
        f"data.num_classes={args.classes}",
        f"data.length={args.batch * args.steps}",
        f"trainer.batch_size={args.batch}",
        "trainer.epochs=1",
        f"trainer.warmup_steps={args.warmup}",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.resume=false",
        "trainer.log_every=1",
    ]
    ips: dict[str, list[float]] = {side: [] for side in SIDES}
    wall: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    images = args.batch * args.steps
    #: the machine's 1-minute load average before this benchmark's work, then as each round starts
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        with MlflowServer(Path(tmp)) as server:
            uri = server.uri
            run_worker(make_job(Path(tmp) / "warm-up", common))
            for r in range(args.rounds):
                load.append(os.getloadavg()[0])
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                for side in order:
                    loggers = ["logger=[console]"]
                    if side != "console":
                        loggers = [
                            "logger=[console,mlflow]",
                            f"logger.mlflow.tracking_uri={uri}",
                            "logger.mlflow.experiment=overhead",
                            f"logger.mlflow.async_logging={str(side == 'mlflow_async').lower()}",
                        ]
                    job = make_job(Path(tmp) / f"{side}-{r}", [*common, *loggers])
                    started = time.process_time()
                    result = run_worker(job)
                    cpu[side].append((time.process_time() - started) / images)
                    ips[side].append(result["images_per_sec"])
                    wall[side].append(result["wall_time_s"])
                print(
                    f"round {r + 1}: "
                    + ", ".join(
                        f"{s} {ips[s][-1]:.1f} img/s ({wall[s][-1]:.2f} s, {1000 * cpu[s][-1]:.2f} CPU ms/img)"
                        for s in SIDES
                    ),
                    flush=True,
                )
    medians = {side: summary(ips[side]) for side in SIDES}
    per_round = {
        side: [m / c for m, c in zip(ips[side], ips["console"], strict=True)]
        for side in ("mlflow_async", "mlflow_sync")
    }
    payload: dict[str, Any] = {
        "benchmark": "mlflow_overhead",
        "load_average": [round(x, 2) for x in load],
        # 3 rounds or more on a machine with no other work as it started (as benchmarks/profiler_overhead.py)
        "quiet": args.rounds >= 3 and load[0] < 0.5,
        "config": vars(args) | {"log_every": 1, "tracking": "mlflow server on 127.0.0.1, SQLite store"},
        "images_per_sec": medians,
        "wall_time_s": {side: summary(wall[side]) for side in SIDES},
        "async_ratio": medians["mlflow_async"]["median"] / medians["console"]["median"],
        "sync_ratio": medians["mlflow_sync"]["median"] / medians["console"]["median"],
        "per_round_ratios": per_round,
        "cpu_ms_per_image": {side: summary([1000 * c for c in cpu[side]]) for side in SIDES},
        "cpu_ratio_async": statistics.median(cpu["console"]) / statistics.median(cpu["mlflow_async"]),
        "cpu_ratio_sync": statistics.median(cpu["console"]) / statistics.median(cpu["mlflow_sync"]),
        "goal": "async_ratio >= 0.99",
    }
    path = write_result("mlflow_overhead", payload)
    print(
        f"images/sec, mlflow async / console: {payload['async_ratio']:.4f}, "
        f"sync / console: {payload['sync_ratio']:.4f}; "
        f"CPU per image, console / async: {payload['cpu_ratio_async']:.4f}, console / sync: "
        f"{payload['cpu_ratio_sync']:.4f} (medians of {args.rounds} rounds) -> {path}"
    )


if __name__ == "__main__":
    main()
