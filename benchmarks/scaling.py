"""Scaling efficiency of ddlkit's data-parallel training on this machine, and how fast a job
ends when one of its ranks dies.

Throughput: images/sec (``result.json``, measured as ``tf_cnn_benchmarks`` does: warm-up steps
excluded) of the same model and per-rank batch on 1, 2 and 4 ranks, per framework and
``dist`` backend, each job a real ``ddlkit`` command with ``compute=local_mpi`` and one intra-op
thread per rank (``framework.num_threads=1``, ``OMP_NUM_THREADS=1``). Scaling efficiency =
throughput(n) / (n x throughput(1)). The 1-rank job goes through the same launcher (mpirun,
one rank) and trains alone, so the baseline is the plain single-process loop. Rounds visit the
configurations in turn, so that drift in the machine's load hits them alike; each round's n-rank
throughput is compared with the same round's 1-rank run, and ``efficiency`` is the median over
rounds (``efficiency_best`` compares the best rounds: those least disturbed by other work on the
machine, whose 1-minute load is recorded before every job). On a 2-core machine 2 ranks is the
meaningful point (goal >= 0.90); 4 ranks oversubscribe the cores, so their efficiency is at most 0.5.

Failure: a 2-rank PyTorch job (dist=native) is killed at one rank with SIGKILL mid-training; the
time from the kill to the launcher's exit is reported, and likewise from a SIGTERM to the
launcher (preemption: agree on a step, checkpoint, exit ``EXIT_PREEMPTED``). The cost of the per-step stop
agreement (one all-reduce of a flag over ddlkit's control plane) is measured on its own.

    python benchmarks/scaling.py [--rounds 2 --steps 30] [--configs pytorch/native,tensorflow/native]

Writes benchmarks/results/scaling.json and scaling.png.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, rank_workers, summary, write_result
from _common import one_thread_env as env

from ddlkit.jobdir import EXIT_PREEMPTED, RESULT_FILE

#: framework=keras only with Horovod: it refuses dist=native (Keras 3's fit fails under
#: MultiWorkerMirroredStrategy)
CONFIGS = ("pytorch/native", "pytorch/horovod", "tensorflow/native", "tensorflow/horovod", "keras/horovod")
RANKS = (1, 2, 4)


def available(config: str) -> str | None:
    """Why ``config`` cannot run here, or None."""
    import importlib.util

    framework, backend = config.split("/")
    if importlib.util.find_spec(f"ddlkit_{framework}") is None:
        return f"the ddlkit-{framework} plugin is not installed"
    if backend == "horovod" and framework == "pytorch":
        from ddlkit_pytorch.framework import horovod_problem

        return horovod_problem()
    if backend == "horovod":  # tensorflow and keras share the TensorFlow plugin's check
        from ddlkit_tensorflow.runtime import horovod_problem as tensorflow_horovod_problem

        return tensorflow_horovod_problem(framework)
    return None


def job_args(config: str, ranks: int, *, steps: int, batch: int, image_size: int, model: str) -> list[str]:
    framework, backend = config.split("/")
    return [
        f"framework={framework}",
        "framework.num_threads=1",
        f"model={model}",
        f"data.image_size={image_size}",
        "data.num_classes=100",
        f"data.length={batch * ranks * steps}",
        f"trainer.batch_size={batch}",
        "trainer.epochs=1",
        "trainer.warmup_steps=5",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.log_every=10",
        "logger=[jsonl]",
        "compute=local_mpi",
        f"compute.procs_per_node={ranks}",
        f"dist={backend}",
    ]


def run_job(args: list[str], job_dir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit", *args, f"hydra.run.dir={job_dir}"],
        cwd=job_dir.parent,
        env=env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"ddlkit {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
        )
    return json.loads((job_dir / RESULT_FILE).read_text())


def measure_scaling(
    configs: list[str], rounds: int, work: Path, ranks: tuple[int, ...] = RANKS, **shape: Any
) -> dict[str, Any]:
    samples: dict[str, dict[int, list[float]]] = {c: {n: [] for n in ranks} for c in configs}
    loads: dict[str, dict[int, list[float]]] = {c: {n: [] for n in ranks} for c in configs}
    for r in range(rounds):
        for config in configs:
            for n in ranks:
                job_dir = work / f"{config.replace('/', '-')}-{n}-{r}"
                # the machine's load before the job: other work on the cores skews the numbers
                loads[config][n].append(round(os.getloadavg()[0], 2))
                result = run_job(job_args(config, n, **shape), job_dir)
                samples[config][n].append(result["images_per_sec"])
                print(
                    f"round {r + 1}/{rounds} {config} {n} rank(s): {result['images_per_sec']:.1f} images/s "
                    f"(load before: {loads[config][n][-1]})",
                    flush=True,
                )
    return {
        config: summarise({str(n): v for n, v in by_n.items()}, {str(n): v for n, v in loads[config].items()})
        for config, by_n in samples.items()
    }


def summarise(samples: dict[str, list[float]], loads: dict[str, list[float]]) -> dict[str, Any]:
    """Per rank count: the throughput samples (one per round), and the scaling efficiency of
    each round against that round's 1-rank run (minutes apart, so under similar load), whose
    median is ``efficiency``; ``efficiency_best`` compares the best rounds instead."""
    base = samples["1"]
    out = {}
    for n, values in samples.items():
        paired = [v / (int(n) * b) for v, b in zip(values, base, strict=True)]
        out[n] = {
            **summary(values),
            "best": max(values),
            "load_1m_before": loads[n],
            "efficiency": round(statistics.median(paired), 3),
            "efficiency_best": round(max(values) / (int(n) * max(base)), 3),
        }
    return out


def _worker_pid(job_dir: Path, rank: int) -> int | None:
    """Rank ``rank``'s worker of the job in ``job_dir``."""
    return next(
        (pid for pid, environ in rank_workers(job_dir).items() if environ.get("OMPI_COMM_WORLD_RANK") == str(rank)),
        None,
    )


def measure_stop(how: str, work: Path, shape: dict[str, Any]) -> dict[str, Any]:
    """Seconds from SIGKILL of rank 1's worker (``kill``) or from SIGTERM to the launcher
    (``preempt``) to the launcher's exit, with the launcher's exit status."""
    job_dir = work / f"{how}-{time.monotonic_ns()}"
    job_dir.mkdir()
    # the console logger's progress lines tell when training is under way
    # the job's end is what is timed: no automatic restart after the kill
    args = [
        *job_args("pytorch/native", 2, **{**shape, "steps": 100000}),
        "trainer.log_every=1",
        "logger=[console]",
        "restart.max_restarts=0",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args, f"hydra.run.dir={job_dir}"],
        cwd=work,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "step 8/" in line:
            break
    else:
        raise RuntimeError(f"the job ended before training got under way:\n{''.join(seen)[-3000:]}")
    t0 = time.perf_counter()
    if how == "kill":
        pid = _worker_pid(job_dir, 1)
        if pid is None:
            proc.kill()
            raise RuntimeError(f"rank 1's worker of {job_dir} was not found; the job was stopped")
        os.kill(pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    return {"seconds": round(time.perf_counter() - t0, 3), "exit_status": proc.returncode}


def _stop_check_rank(rank: int, port: int, n: int, out: Any) -> None:
    from ddlkit.rank.distributed import DistContext

    env = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2", "DDLKIT_CONTROL_ADDR": f"127.0.0.1:{port}"}
    ctx = DistContext.from_env("native", env)
    ctx.connect("bench", env=env)
    ctx.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        ctx.any(False)
    out.put((time.perf_counter() - t0) / n)
    ctx.close()


def measure_stop_check(n: int = 5000) -> dict[str, Any]:
    from ddlkit_mpi.target import free_ports

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    (port,) = free_ports(1)
    procs = [ctx.Process(target=_stop_check_rank, args=(r, port, n, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    seconds = max(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    return {"ranks": 2, "checks": n, "seconds_per_check": seconds}


def plot(scaling: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(scaling)
    ranks = sorted({int(n) for by_n in scaling.values() for n in by_n})  # the rank counts measured
    width = 0.8 / len(ranks)
    fig, ax = plt.subplots(figsize=(2.2 + 2.2 * len(configs), 4.2))
    colors = ("#4c72b0", "#dd8452", "#55a868")
    for i, n in enumerate(ranks):
        xs = [c + (i - (len(ranks) - 1) / 2) * width for c in range(len(configs))]
        values = [scaling[c][str(n)]["median"] for c in configs]
        bars = ax.bar(xs, values, width * 0.95, label=f"{n} rank{'s' if n > 1 else ''}", color=colors[i % 3])
        for bar, config in zip(bars, configs, strict=True):
            eff = scaling[config][str(n)]["efficiency"]
            ax.annotate(
                f"{bar.get_height():.0f}" + ("" if n == 1 else f"\n{eff:.0%}"),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(configs)), [c.replace("/", "\n") for c in configs])
    ax.set_ylabel("images/sec")
    ax.set_title(title, fontsize=10)
    ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def chart_title(shape: dict[str, Any]) -> str:
    return (
        f"ddlkit data-parallel throughput on {os.cpu_count()} CPU cores ({shape['model']}, "
        f"{shape['image_size']}px, batch {shape['batch']}/rank, 1 thread/rank)"
    )


def replot(args: argparse.Namespace) -> None:
    path = RESULTS / "scaling.json"
    payload = json.loads(path.read_text())
    payload["scaling"] = {
        config: summarise(
            {n: p["samples"] for n, p in points.items()}, {n: p["load_1m_before"] for n, p in points.items()}
        )
        for config, points in payload["scaling"].items()
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    plot(payload["scaling"], RESULTS / "scaling.png", chart_title(payload["shape"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="steps per job (5 of them warm-up)")
    parser.add_argument("--batch", type=int, default=32, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--stop-repeats", type=int, default=3)
    parser.add_argument(
        "--ranks",
        default=",".join(map(str, RANKS)),
        help="rank counts to run (1 is the baseline every efficiency is measured against)",
    )
    parser.add_argument(
        "--replot",
        action="store_true",
        help="recompute the efficiencies and redraw the chart from scaling.json; run nothing",
    )
    args = parser.parse_args()
    if args.replot:
        replot(args)
        return
    ranks = tuple(int(n) for n in args.ranks.split(","))
    if 1 not in ranks:
        parser.error("--ranks must include 1: each efficiency is measured against one rank")
    shape = {"steps": args.steps, "batch": args.batch, "image_size": args.image_size, "model": args.model}
    skipped = {c: why for c in args.configs.split(",") if (why := available(c))}
    configs = [c for c in args.configs.split(",") if c not in skipped]
    with tempfile.TemporaryDirectory(prefix="ddlkit-scaling-") as tmp:
        work = Path(tmp)
        scaling = measure_scaling(configs, args.rounds, work, ranks, **shape)
        stops = {how: [measure_stop(how, work, shape) for _ in range(args.stop_repeats)] for how in ("kill", "preempt")}
    stop_check = measure_stop_check()
    payload = {
        "benchmark": "scaling",
        "what": f"images/sec of data-parallel training on {', '.join(map(str, ranks))} ranks (compute=local_mpi, "
        "1 thread per rank); "
        "efficiency = throughput(n) / (n x throughput(1))",
        "shape": {**shape, "threads_per_rank": 1, "data": "synthetic"},
        "goal": {"efficiency_at_2_ranks": 0.90},
        "scaling": scaling,
        "skipped": skipped,
        "death_to_exit_s": {
            **summary([s["seconds"] for s in stops["kill"]]),
            "exit_status": [s["exit_status"] for s in stops["kill"]],
            "how": "SIGKILL to rank 1's worker of a 2-rank pytorch/native job; until the launcher exits",
        },
        "sigterm_to_exit_s": {
            **summary([s["seconds"] for s in stops["preempt"]]),
            "exit_status": [s["exit_status"] for s in stops["preempt"]],
            "how": f"SIGTERM to the launcher: ranks agree on a step, rank 0 checkpoints, all exit {EXIT_PREEMPTED}",
        },
        "stop_check": stop_check,
    }
    path = write_result("scaling", payload)
    plot(scaling, RESULTS / "scaling.png", chart_title(shape))
    print(json.dumps({c: {n: v["efficiency"] for n, v in s.items()} for c, s in scaling.items()}))
    print(f"wrote {path} and {RESULTS / 'scaling.png'}")


if __name__ == "__main__":
    main()
