"""Sharded training (``dist=fsdp``, issue 41): throughput and memory of ViT-B/16 and ViT-L/16 at
2 ranks against ``dist=native``, against a hand-written ``fully_shard`` loop, and the stall a
checkpoint puts on the training thread, written in the background or at once.

Every ddlkit job is a real ``ddlkit`` command, ``compute=local_mpi`` with 2 ranks of one thread
each, gloo on the CPU (as in ``benchmarks/scaling.py``), ``optimizer=adamw``, synthetic images.
The shape is chosen so that a step takes seconds on a 2-core machine, not minutes: **32 px
images** (2 x 2 patches of 16 px, plus the class token: 5 tokens; the models' parameters are
those of the 224 px models but for the position embedding), **batch 8 per rank**, 100 classes. At
this size a step is mostly the optimizer, the collectives and the weights' traffic, not the
attention: read images/sec as relative figures, not as ViT's speed at 224 px.

1. **native / fsdp / fsdp+ac / fsdp-mmap-1mib** (``dist=native``; ``dist=fsdp``; ``dist=fsdp
   framework.activation_checkpointing=true``; ``dist=fsdp framework.fsdp_mmap_threshold_mib=1``,
   glibc's malloc returning freed blocks): ``images_per_sec`` (warm-up steps excluded) and
   ``peak_memory_mib`` (the largest peak RSS over the ranks) from ``result.json``. The memory ratio
   fsdp/native is given twice: for the model's state (``model_state_mib``: rank 0's parameters,
   gradients and AdamW's two moments, its shards under fsdp; issue goal: <= 0.6; beside it the
   estimate of 16 bytes a parameter, 16 P per rank for native and 16 P / N for fsdp), and for peak
   RSS, which holds much besides the model's state: torch, the activations, the gloo buffers, the
   input pool, DDP's gradient buckets for native, and the host copy of a background checkpoint.
2. **hand-written**: ``benchmarks/_fsdp_loop.py`` under ``torchrun`` (``python -m
   torch.distributed.run --standalone --nproc_per_node 2``): the same model, blocks, AdamW,
   batch and data shape, with no framework. It runs right after (or, every other round, right
   before) the same round's ``dist=fsdp`` job; ``ddlkit_over_hand`` is their images/sec ratio per
   round, and its median (goal >= 0.98).
3. **checkpoint stall**: ViT-B/16 with ``dist=fsdp``, ``trainer.checkpoint_every=3``, once with
   ``trainer.checkpoint_async=true`` (ddlkit's default: the state is copied into host memory at
   the step and written by a thread) and once with ``false`` (DCP writes at the step). The stall is
   how long each checkpoint held the training thread, from ``result.json``'s ``checkpoint_stall_s``
   (the median over the job's checkpoints): the copy in the background, the whole write at once;
   the goal is a background stall <= 10 % of the synchronous one. Beside it, from one line per step
   in ``metrics.jsonl`` (``trainer.log_every=1``, each with its time), the checkpointing step's
   excess over the median of the run's other steps (warm-up excluded; a checkpoint taken after step
   k lands in step k + 1's duration): with 2 ranks on 2 cores the background writer has no core of
   its own, so its work lands on the steps it overlaps -- the hold is the training thread's, the
   excess the machine's. ``async_other_steps_slowdown_s`` is how much longer the other steps of the
   background run are than those of the synchronous one (median against median).

Rounds visit the configurations in an order that rotates from round to round. ViT-L/16 jobs are
long (a minute or more of start-up, ~15 s a step here), so they run in ``--large-rounds`` rounds
(default 1) and ViT-B/16's in ``--rounds``. The JSON records the 1-minute load average before each
job and the share of the machine's CPU time that other processes took while the benchmark ran
(from ``/proc/stat`` less this process's children): ``quiet`` is false when that share exceeds
10 %, for a smoke run, or with fewer than 3 rounds.

    python benchmarks/fsdp.py [--rounds 3 --large-rounds 1 --steps 8 --image-size 32 --batch 8] [--quick]

Writes ``benchmarks/results/fsdp.json`` and ``fsdp.png``; ``--quick`` (1 round, ViT-B/16 only, a few
steps) writes ``fsdp-smoke.json`` and ``.png`` instead. ``--large-only --large-rounds 3`` runs ViT-L/16's
rounds alone (about 15 minutes each here) and merges them into ``fsdp.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import RESULTS, one_thread_env, summary, write_result
from scaling import run_job

HAND_LOOP = Path(__file__).with_name("_fsdp_loop.py")
RANKS = 2
#: name -> the overrides of the variant
VARIANTS: dict[str, list[str]] = {
    "native": ["dist=native"],
    "fsdp": ["dist=fsdp"],
    "fsdp+ac": ["dist=fsdp", "framework.activation_checkpointing=true"],
    # glibc's malloc returning freed blocks of 1 MiB and more: what it saves of the peak, and what it costs
    "fsdp-mmap-1mib": ["dist=fsdp", "framework.fsdp_mmap_threshold_mib=1"],
}
#: parameters, gradients and AdamW's exp_avg and exp_avg_sq, fp32
STATE_BYTES_PER_PARAM = 16
CHECKPOINT_EVERY = 3


def job_args(model: str, *, steps: int, batch: int, image_size: int, warmup: int) -> list[str]:
    return [
        "framework=pytorch",
        "framework.num_threads=1",
        f"model={model}",
        "optimizer=adamw",
        f"data.image_size={image_size}",
        "data.num_classes=100",
        f"data.length={batch * RANKS * steps}",
        f"trainer.batch_size={batch}",
        "trainer.epochs=1",
        f"trainer.warmup_steps={warmup}",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.log_every=10",
        "logger=[jsonl]",
        "compute=local_mpi",
        f"compute.procs_per_node={RANKS}",
    ]


def hand_loop(model: str, *, steps: int, batch: int, image_size: int, warmup: int) -> dict[str, Any]:
    """The hand-written fully_shard loop's images/sec and peak RSS (MiB, the larger rank's)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(RANKS),
            str(HAND_LOOP),
            "--model",
            model,
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--batch",
            str(batch),
            "--image-size",
            str(image_size),
        ],
        env=one_thread_env(),
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        # rank 0 measured and said its figures; a rank that aborts in the teardown after them (seen
        # once: SIGABRT after the last step) does not change them
        return json.loads(lines[-1])
    raise RuntimeError(f"the hand-written loop failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def parameters(model: str, image_size: int) -> int:
    """The model's parameter count, built on the meta device (no memory, no time)."""
    import torch

    from ddlkit_pytorch import vit

    with torch.device("meta"):
        m = vit.MODELS[model](image_size=image_size, num_classes=100)
    return sum(p.numel() for p in m.parameters())


def step_durations(job_dir: Path) -> dict[int, float]:
    """Step -> seconds since the previous step's line in metrics.jsonl (trainer.log_every=1)."""
    times = {}
    for line in (job_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("split") == "train":
            times[record["step"]] = record["time"]
    return {s: times[s] - times[s - 1] for s in sorted(times) if s - 1 in times}


def stalls(job_dir: Path, *, every: int, warmup: int) -> tuple[list[float], float]:
    """The excess of each checkpointing step (the one after a checkpoint) over the median of the
    run's other steps past the warm-up, and that median."""
    d = step_durations(job_dir)
    checkpointing = {s for s in d if (s - 1) % every == 0}
    others = [v for s, v in d.items() if s not in checkpointing and s > warmup]
    base = statistics.median(others)
    return [round(d[s] - base, 3) for s in sorted(checkpointing)], base


class CpuWatch:
    """How much of the machine's CPU time other processes took: /proc/stat's busy time less the
    CPU time of this process and its (waited-for) children, descendants included."""

    def __init__(self) -> None:
        self.start = self._busy(), self._ours()

    @staticmethod
    def _busy() -> tuple[float, float]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + fields[4]
        # user nice system idle iowait irq softirq steal (guest time is inside user already)
        total = sum(fields[:8])
        return (total - idle) / tick, total / tick

    @staticmethod
    def _ours() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def others_share(self) -> dict[str, float]:
        (busy0, total0), ours0 = self.start
        busy1, total1 = self._busy()
        ours = self._ours() - ours0
        capacity = total1 - total0
        others = max(0.0, (busy1 - busy0) - ours)
        return {
            "machine_cpu_s": round(capacity, 1),
            "benchmark_cpu_s": round(ours, 1),
            "others_cpu_s": round(others, 1),
            "others_share": round(others / capacity, 3) if capacity > 0 else 0.0,
        }


def plot(throughput: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    colors = {
        "native": "tab:gray",
        "fsdp": "tab:blue",
        "fsdp+ac": "tab:cyan",
        "fsdp-mmap-1mib": "tab:purple",
        "hand-written": "tab:orange",
    }
    for ax, key, label in (
        (axes[0], "images_per_sec", "images/sec (2 ranks)"),
        (axes[1], "peak_memory_mib", "peak RSS per rank, MiB"),
    ):
        x = 0
        ticks, names = [], []
        for i, (model, variants) in enumerate(throughput.items()):
            start = x
            for name, res in variants.items():
                ax.bar(x, res[key]["median"], color=colors.get(name, "k"), label=None if i else name)
                ax.plot([x] * len(res[key]["samples"]), res[key]["samples"], "k.", ms=4)
                x += 1
            ticks.append((start + x - 1) / 2)
            names.append(model)
            x += 1
        ax.set_xticks(ticks, names)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of ViT-B/16 (and of the hand-written loop)")
    ap.add_argument("--large-rounds", type=int, default=1, help="rounds of ViT-L/16 (0: none)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--checkpoint-steps", type=int, default=10, help="steps of each checkpoint-stall job")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round, ViT-B/16 only, a few steps")
    ap.add_argument(
        "--large-only",
        action="store_true",
        help="only ViT-L/16's --large-rounds, merged into the last fsdp.json (its ViT-B/16 rows, hand-written "
        "loop and checkpoint stall kept, with their own date and load)",
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.large_rounds, args.steps, args.warmup, args.checkpoint_steps = 1, 0, 4, 1, 7
    shape = {"steps": args.steps, "batch": args.batch, "image_size": args.image_size, "warmup": args.warmup}
    models = {"vit_b_16": args.rounds, **({"vit_l_16": args.large_rounds} if args.large_rounds else {})}
    if args.large_only:
        if args.large_rounds < 1 or not (RESULTS / "fsdp.json").exists():
            ap.error("--large-only needs --large-rounds 1 or more and a benchmarks/results/fsdp.json to merge into")
        models = {"vit_l_16": args.large_rounds}
    ips: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VARIANTS} for m in models}
    peak: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VARIANTS} for m in models}
    hand: list[dict[str, Any]] = []
    paired: list[float] = []
    stall: dict[str, list[float]] = {"sync": [], "async": []}
    held: dict[str, list[float]] = {"sync": [], "async": []}
    state: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VARIANTS} for m in models}
    base_step: dict[str, list[float]] = {"sync": [], "async": []}
    loads: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    started = datetime.datetime.now(datetime.UTC)
    watch = CpuWatch()

    def load(what: str) -> None:
        loads.append({"job": what, "load_1m_before": round(os.getloadavg()[0], 2)})

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for r in range(max(models.values())):
            for model, rounds in models.items():
                if r >= rounds:
                    continue
                order = list(VARIANTS)[r % len(VARIANTS) :] + list(VARIANTS)[: r % len(VARIANTS)]
                for v in order:
                    hand_first = model == "vit_b_16" and v == "fsdp" and r % 2 == 1
                    if hand_first:
                        load("hand-written")
                        hand.append(hand_loop(model, **shape))
                    load(f"{model} {v}")
                    try:
                        result = run_job([*job_args(model, **shape), *VARIANTS[v]], work / f"{model}-{v}-{r}")
                    except RuntimeError as e:  # a finding, recorded; the round goes on without it
                        failures.append({"job": f"round {r + 1} {model} {v}", "error": str(e)[-1500:]})
                        print(f"round {r + 1} {model} {v}: FAILED", flush=True)
                        if hand_first:
                            hand.pop()  # its pair is gone
                        continue
                    ips[model][v].append(result["images_per_sec"])
                    peak[model][v].append(result["peak_memory_mib"])
                    state[model][v].append(result["model_state_mib"])
                    print(
                        f"round {r + 1} {model} {v}: {ips[model][v][-1]:.2f} images/s, "
                        f"peak {peak[model][v][-1]:.0f} MiB (load before {loads[-1]['load_1m_before']})",
                        flush=True,
                    )
                    if model == "vit_b_16" and v == "fsdp":
                        if not hand_first:
                            load("hand-written")
                            hand.append(hand_loop(model, **shape))
                        paired.append(round(ips[model][v][-1] / hand[-1]["images_per_sec"], 3))
                        print(
                            f"round {r + 1} hand-written fully_shard: {hand[-1]['images_per_sec']:.2f} images/s, "
                            f"peak {hand[-1]['peak_memory_mib']:.0f} MiB; ddlkit/hand {paired[-1]}",
                            flush=True,
                        )
                if model != "vit_b_16":
                    continue
                for mode in ["async", "sync"] if r % 2 == 0 else ["sync", "async"]:
                    job_dir = work / f"checkpoint-{mode}-{r}"
                    load(f"checkpoint {mode}")
                    try:
                        result = run_job(
                            [
                                *job_args(model, **{**shape, "steps": args.checkpoint_steps}),
                                "dist=fsdp",
                                "trainer.log_every=1",
                                f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
                                f"trainer.checkpoint_async={str(mode == 'async').lower()}",
                            ],
                            job_dir,
                        )
                    except RuntimeError as e:
                        # a failed write is a finding: recorded, with the job's logs kept (not its checkpoints)
                        kept = Path(tempfile.gettempdir()) / "fsdp-benchmark-failed" / job_dir.name
                        shutil.copytree(job_dir, kept, ignore=shutil.ignore_patterns("checkpoints"), dirs_exist_ok=True)
                        failures.append({"job": f"round {r + 1} checkpoint {mode}", "error": str(e)[-1500:]})
                        print(f"round {r + 1} checkpoint {mode}: FAILED (logs in {kept})", flush=True)
                        continue
                    excess, base = stalls(job_dir, every=CHECKPOINT_EVERY, warmup=args.warmup)
                    stall[mode] += excess
                    base_step[mode].append(round(base, 3))
                    measured = result["checkpoint_stall_s"]
                    assert measured["background"] == (mode == "async"), measured
                    held[mode].append(measured["median"])
                    print(
                        f"round {r + 1} checkpoint {mode}: training thread held {measured['median']} s a checkpoint "
                        f"(median of {measured['checkpoints']}); checkpointing steps longer by {excess} s (other "
                        f"steps {base:.2f} s)",
                        flush=True,
                    )
    cpu = watch.others_share()

    throughput: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    for model in models:
        throughput[model] = {
            v: {"images_per_sec": summary(ips[model][v]), "peak_memory_mib": summary(peak[model][v])} for v in VARIANTS
        }
        n = parameters(model, args.image_size)
        native_state = n * STATE_BYTES_PER_PARAM / 2**20
        native_peak = statistics.median(peak[model]["native"])
        measured_state = {v: statistics.median(state[model][v]) for v in VARIANTS}
        memory[model] = {
            "parameters": n,
            "model_state_mib_per_rank_estimate": {"native": round(native_state), "fsdp": round(native_state / RANKS)},
            # result.json's model_state_mib: rank 0's parameters, gradients and optimizer state (its shards)
            "model_state_mib_per_rank": measured_state,
            "model_state_ratio_fsdp_over_native": round(measured_state["fsdp"] / measured_state["native"], 3),
            "peak_ratio_fsdp_over_native": round(statistics.median(peak[model]["fsdp"]) / native_peak, 3),
            "peak_ratio_fsdp_ac_over_native": round(statistics.median(peak[model]["fsdp+ac"]) / native_peak, 3),
            "peak_ratio_fsdp_mmap_1mib_over_native": round(
                statistics.median(peak[model]["fsdp-mmap-1mib"]) / native_peak, 3
            ),
            "speed_ratio_fsdp_mmap_1mib_over_fsdp": round(
                statistics.median(ips[model]["fsdp-mmap-1mib"]) / statistics.median(ips[model]["fsdp"]), 3
            ),
            "speed_ratio_fsdp_over_native": round(
                statistics.median(ips[model]["fsdp"]) / statistics.median(ips[model]["native"]), 3
            ),
            "speed_ratio_fsdp_ac_over_native": round(
                statistics.median(ips[model]["fsdp+ac"]) / statistics.median(ips[model]["native"]), 3
            ),
        }
    if args.large_only:
        merge_large(args, throughput, memory, cpu, loads, failures, started)
        return
    throughput["vit_b_16"]["hand-written"] = {
        "images_per_sec": summary([h["images_per_sec"] for h in hand]),
        "peak_memory_mib": summary([h["peak_memory_mib"] for h in hand]),
    }
    hand_ratio = statistics.median(paired)
    sync_held, async_held = statistics.median(held["sync"]), statistics.median(held["async"])
    held_ratio = async_held / sync_held if sync_held > 0 else float("inf")
    sync_stall, async_stall = statistics.median(stall["sync"]), statistics.median(stall["async"])
    stall_ratio = async_stall / sync_stall if sync_stall > 0 else float("inf")
    goals = {
        "model_state_ratio_le_0.6": {m: memory[m]["model_state_ratio_fsdp_over_native"] <= 0.6 for m in models},
        "ddlkit_over_hand_ge_0.98": hand_ratio >= 0.98,
        "background_stall_le_0.1_of_sync": held_ratio <= 0.1,
    }
    partial = args.quick or args.rounds < 3
    payload = {
        "benchmark": "fsdp",
        "date": started.date().isoformat(),
        "config": {
            **vars(args),
            "ranks": RANKS,
            "threads_per_rank": 1,
            "backend": "gloo (CPU)",
            "optimizer": "adamw",
            "data": "synthetic, 100 classes",
            "checkpoint_every": CHECKPOINT_EVERY,
            "note": f"{args.image_size} px images ({(args.image_size // 16) ** 2} patches + the class token) so that "
            "a step takes seconds on 2 cores: images/sec are relative figures, not ViT's speed at 224 px",
        },
        "quick": args.quick,
        # a smoke run, or a run that shared the cores with other work, is no clean measurement
        "quiet": not partial and cpu["others_share"] <= 0.10,
        "cpu": cpu,
        "load_1m": {
            "median": statistics.median(x["load_1m_before"] for x in loads),
            "max": max(x["load_1m_before"] for x in loads),
            "per_job": loads,
        },
        "throughput": throughput,
        "memory": memory,
        "hand_written": {
            "ddlkit_over_hand_per_round": paired,
            "ddlkit_over_hand": hand_ratio,
            "goal": 0.98,
        },
        "checkpoint_stall": {
            # result.json's checkpoint_stall_s: how long each checkpoint held the training thread (per job: the
            # median over its checkpoints)
            "sync_held_s": summary(held["sync"]),
            "async_held_s": summary(held["async"]),
            "async_over_sync": round(held_ratio, 3),
            "goal": 0.1,
            # the checkpointing steps' excess over the other steps: the hold plus, in the background, the writer
            # thread's competition for the cores while it writes
            "sync_step_excess_s": summary(stall["sync"]),
            "async_step_excess_s": summary(stall["async"]),
            "step_excess_async_over_sync": round(stall_ratio, 3),
            "other_steps_s": {mode: summary(v) for mode, v in base_step.items()},
            "async_other_steps_slowdown_s": round(
                statistics.median(base_step["async"]) - statistics.median(base_step["sync"]), 3
            ),
        },
        "goals_met": goals,
        "failures": failures,
    }
    name = "fsdp-smoke" if partial else "fsdp"
    path = write_result(name, payload)
    plot(
        throughput,
        RESULTS / f"{name}.png",
        f"dist=native vs fsdp, 2 ranks x 1 thread, gloo, {args.image_size} px, batch {args.batch}/rank, AdamW; "
        f"medians of {args.rounds} (ViT-B) / {args.large_rounds} (ViT-L) rounds",
    )
    for model in models:
        for v, res in throughput[model].items():
            print(
                f"{model} {v:12s} {res['images_per_sec']['median']:7.2f} images/s  "
                f"peak {res['peak_memory_mib']['median']:7.0f} MiB"
            )
        print(f"{model} {json.dumps(memory[model])}")
    print(f"ddlkit/hand-written {hand_ratio} (rounds {paired}); goal >= 0.98")
    print(
        f"checkpoint stall (training thread held): sync {sync_held:.3f} s, background {async_held:.3f} s, "
        f"ratio {held_ratio:.3f}; checkpointing steps' excess: sync {sync_stall:.2f} s, background "
        f"{async_stall:.2f} s, ratio {stall_ratio:.3f}"
    )
    print(f"others' CPU share {cpu['others_share']}; quiet={payload['quiet']}")
    print(f"-> {path}")


def merge_large(
    args: argparse.Namespace,
    throughput: dict[str, Any],
    memory: dict[str, Any],
    cpu: dict[str, float],
    loads: list[dict[str, Any]],
    failures: list[dict[str, str]],
    started: datetime.datetime,
) -> None:
    """ViT-L/16's rows of a ``--large-only`` run into the last ``fsdp.json``: its own date, rounds, CPU
    share and loads under ``vit_l_16_run``; the rest of the file as it was."""
    payload = json.loads((RESULTS / "fsdp.json").read_text())
    payload["throughput"]["vit_l_16"] = throughput["vit_l_16"]
    payload["memory"]["vit_l_16"] = memory["vit_l_16"]
    payload["goals_met"]["model_state_ratio_le_0.6"]["vit_l_16"] = (
        memory["vit_l_16"]["model_state_ratio_fsdp_over_native"] <= 0.6
    )
    payload["config"]["large_rounds"] = args.large_rounds
    payload["vit_l_16_run"] = {
        "date": started.date().isoformat(),
        "rounds": args.large_rounds,
        "quiet": args.large_rounds >= 3 and cpu["others_share"] <= 0.10,
        "cpu": cpu,
        "load_1m": {"max": max(x["load_1m_before"] for x in loads), "per_job": loads},
        "failures": failures,
    }
    path = write_result("fsdp", payload)
    rounds = payload["config"]["rounds"]
    plot(
        payload["throughput"],
        RESULTS / "fsdp.png",
        f"dist=native vs fsdp, 2 ranks x 1 thread, gloo, {args.image_size} px, batch {args.batch}/rank, AdamW; "
        f"medians of {rounds} (ViT-B) / {args.large_rounds} (ViT-L) rounds",
    )
    for v, res in throughput["vit_l_16"].items():
        print(
            f"vit_l_16 {v:12s} {res['images_per_sec']['median']:7.2f} images/s  "
            f"peak {res['peak_memory_mib']['median']:7.0f} MiB"
        )
    print(f"vit_l_16 {json.dumps(memory['vit_l_16'])}")
    print(f"others' CPU share {cpu['others_share']}; quiet={payload['vit_l_16_run']['quiet']} -> {path}")


if __name__ == "__main__":
    main()
