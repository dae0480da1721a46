"""PyTorch DDP settings, A/B: 2-rank scaling efficiency of ``dist=native`` under each variant of
DistributedDataParallel's knobs (issue 29, item 1), beside Horovod on the same cores.

Every job is a real ``ddlkit`` command with ``compute=local_mpi`` and one thread per rank, as in
``benchmarks/scaling.py`` (whose job arguments and environment it uses). A round runs the 1-rank
job, then each variant's 2-rank job, in an order that rotates from round to round (so no variant
always follows the 1-rank job or another variant); a variant's efficiency in a round is its
images/sec over twice that round's 1-rank images/sec, and the JSON keeps every round's and
their median. Variants (``framework.ddp_*``, see the PyTorch plugin's README):

* ``torch-defaults``: bucket 25 MB, gradients copied into the buckets, no static graph (ddlkit before);
* ``ddlkit-defaults``: the plugin's defaults as they are now;
* ``bucket-view``: gradients as bucket views only; ``static-graph``: the static graph only;
* ``view+static``; ``bucket-5mb`` / ``bucket-100mb`` (one bucket for ResNet-18: no overlap of the
  all-reduce with the backward pass, whose thread competes with the compute thread for the core);
* ``horovod`` where Horovod is built for torch;
* ``hand-ddp``: not ddlkit -- a hand-written DDP loop over gloo with torch's defaults
  (``benchmarks/_ddp_loop.py``), run by ``mpirun`` at 1 and at 2 ranks in every round: its
  efficiency is that of its own 2-rank run over twice its own 1-rank run. It separates what DDP
  over gloo costs on these cores from what ddlkit adds (``hand_ddp_over_ddlkit``: ddlkit's default
  2-rank images/sec over the hand loop's, same round).

    python benchmarks/ddp_ab.py [--rounds 5 --steps 40 --model resnet18 --image-size 64 --batch 32]
        [--variants torch-defaults,ddlkit-defaults,...]

A job is about a minute for ResNet-18 at 64 px on 2 cores (its start-up included): about 10 minutes
a round with every variant. Writes benchmarks/results/ddp_ab.json and ddp_ab.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import RESULTS, one_thread_env, summary, write_result
from scaling import available, job_args, run_job

HAND_LOOP = Path(__file__).with_name("_ddp_loop.py")

TORCH_DEFAULTS = [
    "framework.ddp_bucket_cap_mb=25",
    "framework.ddp_gradient_as_bucket_view=false",
    "framework.ddp_static_graph=false",
]
#: name -> (dist backend, overrides)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "torch-defaults": ("native", TORCH_DEFAULTS),
    "ddlkit-defaults": ("native", []),
    "bucket-view": (
        "native",
        [*TORCH_DEFAULTS[:1], "framework.ddp_gradient_as_bucket_view=true", "framework.ddp_static_graph=false"],
    ),
    "static-graph": ("native", [*TORCH_DEFAULTS[:2], "framework.ddp_static_graph=true"]),
    "view+static": (
        "native",
        [*TORCH_DEFAULTS[:1], "framework.ddp_gradient_as_bucket_view=true", "framework.ddp_static_graph=true"],
    ),
    "bucket-5mb": ("native", ["framework.ddp_bucket_cap_mb=5", *TORCH_DEFAULTS[1:]]),
    "bucket-100mb": ("native", ["framework.ddp_bucket_cap_mb=100", *TORCH_DEFAULTS[1:]]),
    "horovod": ("horovod", []),
    "hand-ddp": ("native", []),
}


def hand_loop(ranks: int, *, steps: int, batch: int, image_size: int, model: str) -> float:
    """The hand-written DDP loop's images/sec at ``ranks`` ranks (mpirun as compute=local_mpi runs it)."""
    proc = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--bind-to",
            "none",
            "--map-by",
            "slot",
            "-np",
            str(ranks),
            sys.executable,
            str(HAND_LOOP),
            "--steps",
            str(steps),
            "--batch",
            str(batch),
            "--image-size",
            str(image_size),
            "--model",
            model,
        ],
        env={**one_thread_env(), "PMIX_MCA_psec": "native"},
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the hand-written loop failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["images_per_sec"])


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.bar(names, [results[n]["efficiency"] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        ax.plot([i] * len(results[n]["efficiency_per_round"]), results[n]["efficiency_per_round"], "k.", ms=4)
    ax.axhline(0.95, color="gray", ls="--", lw=1)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("2-rank scaling efficiency")
    ax.set_title(title, fontsize=9)
    plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    shape = {"steps": args.steps, "batch": args.batch, "image_size": args.image_size, "model": args.model}
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        ap.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    skipped = {}
    for v in variants:
        if why := available(f"pytorch/{VARIANTS[v][0]}"):
            skipped[v] = why
    variants = [v for v in variants if v not in skipped]
    one_rank: list[float] = []
    hand_one_rank: list[float] = []
    ips: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            one_rank.append(run_job(job_args("pytorch/native", 1, **shape), work / f"one-{r}")["images_per_sec"])
            print(f"round {r + 1}/{args.rounds} 1 rank: {one_rank[-1]:.1f} images/s", flush=True)
            if "hand-ddp" in variants:
                hand_one_rank.append(hand_loop(1, **shape))
                print(f"round {r + 1}/{args.rounds} hand-written loop, 1 rank: {hand_one_rank[-1]:.1f} images/s")
            for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
                backend, overrides = VARIANTS[v]
                if v == "hand-ddp":
                    ips[v].append(hand_loop(2, **shape))
                else:
                    result = run_job([*job_args(f"pytorch/{backend}", 2, **shape), *overrides], work / f"{v}-{r}")
                    ips[v].append(result["images_per_sec"])
                base = hand_one_rank[-1] if v == "hand-ddp" else one_rank[-1]
                print(
                    f"round {r + 1}/{args.rounds} {v}: {ips[v][-1]:.1f} images/s, efficiency "
                    f"{ips[v][-1] / (2 * base):.3f}",
                    flush=True,
                )
    results = {}
    for v in variants:
        bases = hand_one_rank if v == "hand-ddp" else one_rank
        per_round = [round(x / (2 * b), 3) for x, b in zip(ips[v], bases, strict=True)]
        results[v] = {
            "overrides": VARIANTS[v][1],
            "backend": VARIANTS[v][0],
            "images_per_sec": summary(ips[v]),
            "efficiency": statistics.median(per_round),
            "efficiency_per_round": per_round,
        }
    extra: dict[str, Any] = {}
    if hand_one_rank:
        extra["hand_one_rank_images_per_sec"] = summary(hand_one_rank)
        if "ddlkit-defaults" in ips:
            per_round = [round(d / h, 3) for d, h in zip(ips["ddlkit-defaults"], ips["hand-ddp"], strict=True)]
            extra["ddlkit_over_hand_ddp_2_ranks"] = {"median": statistics.median(per_round), "per_round": per_round}
    path = write_result(
        "ddp_ab",
        {
            "benchmark": "ddp_ab",
            "config": vars(args),
            "one_rank_images_per_sec": summary(one_rank),
            "variants": results,
            **extra,
            "skipped": skipped,
        },
    )
    plot(
        results,
        RESULTS / "ddp_ab.png",
        f"PyTorch {args.model} {args.image_size}px batch {args.batch}/rank, "
        f"2 ranks x 1 thread, medians of {args.rounds} rounds",
    )
    for v, res in results.items():
        print(f"{v:16s} efficiency {res['efficiency']:.3f} (rounds: {res['efficiency_per_round']})")
    for v, why in skipped.items():
        print(f"{v:16s} skipped: {why}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
