"""What ``trainer.profile`` costs outside its window (issue 42, item 4; goal: <= 1 %).

The same small PyTorch job of N steps, through the real ``ddlkit`` command, a fresh process each
time, in alternating rounds (which side goes first alternates too): off, and on with
``trainer.profile.start_step=N-1 trainer.profile.num_steps=2`` -- the window is the last two steps.
Both train the same steps on the same data; the rate compared is the images/sec of steps 11 to N-10
(from the wall-clock times ``metrics.jsonl`` records at steps 10 and N-10: after the warm-up, well
before the window). The ratio on / off is reported per round (paired) and as the ratio of the
medians; the window's trace is checked to exist.

The end-to-end ratio on a busy machine has noise of several per cent, far more than the 1 % it is to
show; so the one call the switch adds to every step outside the window
(:meth:`ddlkit.rank.profiling.ProfileWindow.step`) is also timed on its own, as a share of a step.
The JSON says ``quiet: false`` when the 1-minute load average was above 0.5 at the start, or fewer
than 3 rounds ran.

    python benchmarks/profiler_overhead.py [--steps 40 --batch 32 --image-size 64 --rounds 5 --threads 1]
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

from _common import summary, write_result


def run(job_dir: Path, overrides: list[str], first: int, last: int) -> float:
    """``ddlkit OVERRIDES`` in a fresh process; its images/sec from step ``first`` + 1 to ``last``."""
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit", *overrides, f"hydra.run.dir={job_dir}"],
        capture_output=True,
        text=True,
        cwd=job_dir.parent,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ddlkit exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads((job_dir / "result.json").read_text())
    times = {}
    for line in (job_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["split"] == "train":
            times[record["step"]] = record["time"]
    return (last - first) * result["global_batch_size"] / (times[last] - times[first])


def window_call_s(calls: int = 200_000) -> float:
    """Seconds one :meth:`ProfileWindow.step` costs outside the window: all that the switch adds
    to a step there (the run's own ``is not None`` check aside)."""
    from types import SimpleNamespace

    from ddlkit.rank.profiling import ProfileWindow

    window = ProfileWindow(
        10**9, 10**9 + 1, run=SimpleNamespace(), make=lambda r, d: None, out_dir=Path("."), pause=lambda: None
    )
    start = time.perf_counter()
    for step in range(calls):
        window.step(step)
    return (time.perf_counter() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40, help="N: steps of each run (at least 30)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="framework.num_threads (one: steadier on a shared machine)")
    args = ap.parse_args()
    n = args.steps
    common = [
        "framework=pytorch",
        f"model={args.model}",
        f"data.image_size={args.image_size}",
        "data.num_classes=100",
        f"data.length={args.batch * n}",
        f"trainer.batch_size={args.batch}",
        "trainer.epochs=1",
        f"trainer.warmup_steps={args.warmup}",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.resume=false",
        "trainer.log_every=10",
        f"trainer.max_steps={n}",
        "logger=jsonl",
        f"framework.num_threads={args.threads}",
    ]
    off_overrides = common
    on_overrides = [*common, f"trainer.profile.start_step={n - 1}", "trainer.profile.num_steps=2"]
    measured = (10, n - 10)
    load = [os.getloadavg()[0]]
    off, on, paired, traces = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # alternate which side goes first, so drift within a round hits both
            order = [("off", off_overrides), ("on", on_overrides)]
            if r % 2:
                order.reverse()
            got = {}
            for side, overrides in order:
                job = Path(tmp) / f"round{r}-{side}"
                got[side] = run(job, overrides, *measured)
                if side == "on":
                    found = list((job / "profile").rglob("*.pt.trace.json"))
                    if not found:
                        raise RuntimeError(f"no trace in {job}/profile")
                    traces.append(found[0].stat().st_size)
            off.append(got["off"])
            on.append(got["on"])
            paired.append(got["on"] / got["off"])
            load.append(os.getloadavg()[0])
            print(
                f"round {r + 1}: off {got['off']:.1f} img/s, on (steps outside the window) {got['on']:.1f} img/s, "
                f"on / off {paired[-1]:.4f}"
            )
    ratio = statistics.median(on) / statistics.median(off)
    call_s = window_call_s()
    step_s = args.batch / statistics.median(off)
    path = write_result(
        "profiler_overhead",
        {
            "benchmark": "profiler_overhead",
            "config": vars(args),
            "measured_steps": f"{measured[0] + 1}-{measured[1]}",
            "off_images_per_sec": summary(off),
            "on_outside_window_images_per_sec": summary(on),
            "ratio": ratio,
            "paired_ratios": paired,
            "paired_ratio_median": statistics.median(paired),
            "goal": ">= 0.99 (<= 1 % overhead outside the window)",
            # the switch's cost outside the window, measured directly: one ProfileWindow.step per step
            "window_call_us": call_s * 1e6,
            "step_ms": step_s * 1e3,
            "window_call_share_of_step": call_s / step_s,
            "trace_bytes": traces,
            "load_average": load,
            "quiet": args.rounds >= 3 and load[0] < 0.5,
        },
    )
    print(
        f"ratio on / off (medians) = {ratio:.4f}, median of the paired rounds = {statistics.median(paired):.4f} "
        f"(goal >= 0.99); ProfileWindow.step outside the window {call_s * 1e6:.2f} us of a {step_s * 1e3:.0f} ms "
        f"step ({call_s / step_s:.1e}) -> {path}"
    )


if __name__ == "__main__":
    main()
