"""Seeing inside a running job (issue 42), measured: what per-rank step telemetry and the
straggler verdict cost, how soon a straggler is named, and how soon every rank's stacks are
written once a rank falls silent.

* **overhead**: the same 2-rank job (``compute=local_mpi``, one thread per rank) with
  ``dist.telemetry=true`` (the default: phases timed, summaries gathered every
  ``trainer.log_every`` steps, telemetry.json written, the verdict) and with it off, alternating
  in every round, in both orders; the ratio of images/sec per round and their median. Two
  workloads: ``framework=fake`` with no delay (a step of about a millisecond: the worst case for
  a fixed cost per step) and ``framework=pytorch`` ResNet-18 at 32 px.
* **clean runs**: how many 4-rank runs of ``framework=fake`` (a 20 ms step) name a straggler
  though no rank is slowed (goal: none).
* **time to name**: a 4-rank run whose rank 2 is stopped for 50 ms of every 100 ms (SIGSTOP,
  SIGCONT) from step 100 on: the steps and seconds until rank 0 names it.
* **time to stacks**: a 4-rank run whose rank 2 is stopped for good with ``dist.warn_after_s=3``:
  the seconds from rank 0's warning to its line saying the stack files are written (goal <= 5 s),
  and the time the report itself says it took.

    python benchmarks/observability.py [--rounds 3 --clean-runs 10]

Writes benchmarks/results/observability.json. On a machine others share, the figures are noise:
the JSON says the load average before each job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, one_thread_env, summary, write_result

from ddlkit.testing.multirank import Lines, worker_pids

FAKES = {"DDLKIT_PLUGINS": "ddlkit.testing.fakes"}

FAKE = [
    "framework=fake",
    "data.image_size=8",
    "data.num_classes=10",
    "data.length=2000000",
    "trainer.batch_size=4",
    "trainer.epochs=1",
    "trainer.validate=false",
    "trainer.save_model=false",
    "trainer.log_every=10",
    "logger=[jsonl]",
    "compute=local_mpi",
    "dist=native",
]
PYTORCH = [
    "framework=pytorch",
    "framework.num_threads=1",
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=10240",
    "trainer.batch_size=32",
    "trainer.epochs=1",
    "trainer.max_steps=120",
    "trainer.warmup_steps=10",
    "trainer.validate=false",
    "trainer.save_model=false",
    "trainer.log_every=10",
    "logger=[jsonl]",
    "compute=local_mpi",
    "compute.procs_per_node=2",
    "dist=native",
]


def env() -> dict[str, str]:
    return {**one_thread_env(), **FAKES}


def start(args: list[str], job_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args, f"hydra.run.dir={job_dir}"],
        cwd=job_dir.parent,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run(args: list[str], job_dir: Path) -> tuple[dict[str, Any], str]:
    proc = start(args, job_dir)
    output, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"ddlkit {' '.join(args)} failed ({proc.returncode}):\n{output[-3000:]}")
    return json.loads((job_dir / "result.json").read_text()), output


def overhead(work: Path, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    workloads = {
        "fake-1ms-step": [*FAKE, "compute.procs_per_node=2", "trainer.max_steps=3000", "trainer.warmup_steps=50"],
        "pytorch-resnet18-32px": PYTORCH,
    }
    for name, args in workloads.items():
        on, off, ratios, loads = [], [], [], []
        for r in range(rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {}
            for telemetry in order:
                loads.append(round(os.getloadavg()[0], 2))
                result, _ = run([*args, f"dist.telemetry={str(telemetry).lower()}"], work / f"{name}-{r}-{telemetry}")
                got[telemetry] = result["images_per_sec"]
            on.append(got[True])
            off.append(got[False])
            ratios.append(got[True] / got[False])
            print(f"overhead {name} round {r + 1}: on {got[True]:.1f}, off {got[False]:.1f} img/s -> {ratios[-1]:.4f}")
        out[name] = {
            "telemetry_on_images_per_sec": summary(on),
            "telemetry_off_images_per_sec": summary(off),
            "ratio_on_over_off": summary(ratios),
            "load_before_each_job": loads,
        }
    return out


def clean_runs(work: Path, runs: int) -> dict[str, Any]:
    named = []
    for i in range(runs):
        args = [*FAKE, "compute.procs_per_node=4", "trainer.max_steps=400", "framework.step_delay_s=0.02"]
        result, _ = run(args, work / f"clean-{i}")
        named.append(len(result["stragglers"]))
        print(f"clean run {i + 1}/{runs}: {named[-1]} straggler(s) named")
    return {"runs": runs, "steps_each": 400, "ranks": 4, "runs_naming_a_straggler": sum(1 for n in named if n)}


def unit_cost(work: Path) -> dict[str, Any]:
    """The telemetry's own cost, timed alone in this process (no noise of other jobs): per step,
    the two timed phases and the tick; per logging step, the summary, and on rank 0 the verdict
    and the per-rank table over 4 and over 64 ranks."""
    import timeit

    from ddlkit.rank.telemetry import StepTelemetry, StragglerWatch, rank_table

    clock = StepTelemetry(32)

    def one_step() -> None:
        with clock.phase("data"):
            pass
        with clock.phase("step"):
            pass
        clock.tick()

    n = 200_000
    per_step = min(timeit.repeat(one_step, number=n, repeat=5)) / n
    out: dict[str, Any] = {"per_step_us": round(per_step * 1e6, 3)}
    for ranks in (4, 64):
        watch = StragglerWatch(1.2, 50)
        summaries = [clock.summary() | {"steps": 10, "wall": 0.1, "sync": 0.01} for _ in range(ranks)]
        gathered = [{"t": s, "node": 0, "host": "h"} for s in summaries]
        step = iter(range(10, 10**9, 10))

        def log_step(summaries=summaries, gathered=gathered, watch=watch, step=step) -> None:  # type: ignore[no-untyped-def]
            clock.summary()
            watch.observe(next(step), summaries)
            rank_table(gathered)

        m = 2000
        out[f"per_logging_step_us_{ranks}_ranks"] = round(min(timeit.repeat(log_step, number=m, repeat=5)) / m * 1e6, 1)
    return out


#: the console's progress lines: the runs that are watched as they go
WATCHED = ["logger=[console,jsonl]"]


def time_to_name(work: Path) -> dict[str, Any]:
    job_dir = work / "slowed"
    args = [*FAKE, *WATCHED, "compute.procs_per_node=4", "trainer.max_steps=300", "framework.step_delay_s=0.02"]
    proc = start(args, job_dir)
    lines = Lines(proc)
    lines.wait_for(r"step 100/", 300)
    from_step = json.loads((job_dir / "telemetry.json").read_text())["step"]
    began = time.monotonic()
    pid = worker_pids(job_dir)[2]
    try:
        while proc.poll() is None:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    except ProcessLookupError:
        pass
    proc.wait()
    when, named = lines.wait_for(r"ddlkit: rank 2 on node 0 is (\d+) % slower .* to step (\d+)", 5)
    return {
        "slowed_from_step": from_step,
        "named_at_step": int(named[2]),
        "steps_to_name": int(named[2]) - from_step,
        "seconds_to_name": round(when - began, 2),
        "slower_pct_said": int(named[1]),
        "line": named[0],
    }


def time_to_stacks(work: Path) -> dict[str, Any]:
    job_dir = work / "hung"
    args = [
        *FAKE,
        *WATCHED,
        "compute.procs_per_node=4",
        "trainer.max_steps=100000",
        "framework.step_delay_s=0.02",
        "dist.warn_after_s=3",
        "dist.timeout_s=60",
    ]
    proc = start(args, job_dir)
    lines = Lines(proc)
    try:
        lines.wait_for(r"step 50/", 300)
        os.kill(worker_pids(job_dir)[2], signal.SIGSTOP)
        stopped = time.monotonic()
        warned, _ = lines.wait_for(r"rank 2 has not been heard from", 60)
        written, said = lines.wait_for(r"stacks of rank\(s\) ([\d, ]+) written to hang/ in ([\d.]+) s", 60)
    finally:
        for pid in worker_pids(job_dir).values():
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    return {
        "ranks": 4,
        "warn_after_s": 3,
        "seconds_from_stop_to_warning": round(warned - stopped, 2),
        "seconds_from_warning_to_stacks": round(written - warned, 2),
        "report_says_s": float(said[2]),
        "stack_files": sorted(p.name for p in (job_dir / "hang").iterdir()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clean-runs", type=int, default=10)
    parser.add_argument(
        "--parts",
        default="unit_cost,overhead,clean_runs,time_to_name,time_to_stacks",
        help="the parts to measure; the others' figures stay as the JSON has them",
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    parts = {
        "overhead": lambda work: overhead(work, args.rounds),
        "clean_runs": lambda work: clean_runs(work, args.clean_runs),
        "time_to_name": time_to_name,
        "time_to_stacks": time_to_stacks,
        "unit_cost": unit_cost,
    }
    path = RESULTS / "observability.json"
    payload = json.loads(path.read_text()) if path.is_file() else {}
    payload.pop("machine", None)
    with tempfile.TemporaryDirectory(prefix="ddlkit-observability-", ignore_cleanup_errors=True) as tmp:
        for part in args.parts.split(","):
            # a quiet machine: nothing else on its cores (the load average before the part says what was)
            payload[part] = {"load_average_before": round(os.getloadavg()[0], 2), **parts[part](Path(tmp))}
            payload["quiet"] = load < 0.5 and payload.get("quiet", True)
            write_result("observability", payload)  # each part as it is measured
    for name, o in payload.get("overhead", {}).items():
        if isinstance(o, dict):
            print(f"{name}: telemetry on/off images/sec median {o['ratio_on_over_off']['median']:.4f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
