"""framework.num_threads: the old default (all cores, OpenMP's own wait policy) against 1 thread and
the new default ``auto`` (cores per rank, OpenMP threads waiting passively), on a quiet machine and
on a busy one (one busy process per core, started here), for a tiny CNN and ResNet-18 (issue 22,
item 2). PyTorch, one rank, ``compute=local`` through the ``ddlkit`` command: each setting runs in
ranks of its own, since OpenMP reads its settings once per process. Settings alternate within each
round, so machine drift hits all of them alike.

Goal: ``auto`` is never the pathological setting: on the busy machine it keeps most of what 1
thread gets (the old default lost 4-28x there), on the quiet one most of what all cores get.

    python benchmarks/threads.py [--models tiny,resnet18 --image-size 32 --batch 32 --steps 60 --rounds 3]

Writes benchmarks/results/threads.json and threads.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _common import RESULTS, summary, write_result

from ddlkit.jobdir import RESULT_FILE

HERE = Path(__file__).resolve().parent
#: label -> framework.num_threads (the old default: 0, with OpenMP's wait policy left alone)
SETTINGS = {"all cores (old default)": "0", "1 thread": "1", "auto (new default)": "auto"}
#: the environment a setting must not inherit from this shell
OPENMP_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def tiny_cnn(num_classes: int = 10):  # model.target of the runs: imported by the ranks
    """A CNN small enough that thread synchronisation, not arithmetic, sets its speed."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def model_overrides(model: str) -> list[str]:
    if model == "tiny":
        return ["model=custom", "model.target=threads:tiny_cnn"]
    return [f"model={model}"]


def train(model: str, threads: str, args: argparse.Namespace, job_dir: Path) -> float:
    """One run's images/sec (warm-up steps excluded), from its result.json."""
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_ENV}
    cmd = [
        sys.executable,
        "-m",
        "ddlkit",
        "framework=pytorch",
        "framework.device=cpu",
        f"framework.num_threads={threads}",
        *model_overrides(model),
        f"data.image_size={args.image_size}",
        "data.num_classes=10",
        f"data.length={args.batch * args.steps}",
        f"trainer.batch_size={args.batch}",
        "trainer.epochs=1",
        f"trainer.warmup_steps={args.warmup}",
        "trainer.validate=false",
        "trainer.save_model=false",
        f"trainer.log_every={args.steps}",
        "logger=[]",
        f"hydra.run.dir={job_dir}",
    ]
    proc = subprocess.run(
        cmd,
        cwd=HERE,
        env={**env, "DDLKIT_STATE_DIR": str(job_dir.parent / "state")},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((job_dir / RESULT_FILE).read_text())["images_per_sec"]


@contextmanager
def busy_machine() -> Iterator[int]:
    """One busy process per core this process may use: other work on a shared machine."""
    cores = len(os.sched_getaffinity(0))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    time.sleep(1.0)  # let them take their cores
    try:
        yield cores
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()


def measure(args: argparse.Namespace, tmp: Path, condition: str) -> dict[str, dict[str, list[float]]]:
    rates: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SETTINGS} for m in args.models}
    for r in range(args.rounds):
        for model in args.models:
            for label, threads in SETTINGS.items():
                ips = train(model, threads, args, tmp / f"{condition}-{model}-{threads}-{r}")
                rates[model][label].append(ips)
                print(f"{condition} round {r + 1}: {model} {label}: {ips:.1f} img/s", flush=True)
    return rates


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = list(results)
    models = list(results[conditions[0]])
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    width = 0.8 / len(SETTINGS)
    for ax, model in zip(axes[0], models, strict=True):
        for k, label in enumerate(SETTINGS):
            values = [results[c][model][label]["median"] for c in conditions]
            ax.bar([i + k * width for i in range(len(conditions))], values, width, label=label)
        ax.set_xticks([i + width for i in range(len(conditions))], conditions)
        ax.set_title(model)
        ax.set_ylabel("images/s (median)")
        ax.legend(fontsize=8)
    fig.suptitle("PyTorch threads per rank (framework.num_threads)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=lambda s: s.split(","), default=["tiny", "resnet18"])
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    raw = {}
    with tempfile.TemporaryDirectory() as tmp:
        raw["quiet"] = measure(args, Path(tmp), "quiet")
        with busy_machine() as cores:
            raw[f"busy ({cores} busy processes)"] = measure(args, Path(tmp), "busy")
    results = {
        c: {m: {s: summary(v) for s, v in by_setting.items()} for m, by_setting in by_model.items()}
        for c, by_model in raw.items()
    }
    ratios = {}
    for condition, by_model in results.items():
        for model, by_setting in by_model.items():
            auto = by_setting["auto (new default)"]["median"]
            ratios[f"{condition} / {model}"] = {
                "auto / old default": auto / by_setting["all cores (old default)"]["median"],
                "auto / 1 thread": auto / by_setting["1 thread"]["median"],
            }
            said = "  ".join(f"{k} {v:.2f}" for k, v in ratios[f"{condition} / {model}"].items())
            print(f"{condition:>24} {model:>8}: {said}")
    path = write_result(
        "threads",
        {
            "benchmark": "threads",
            "config": vars(args),
            "cores": len(os.sched_getaffinity(0)),
            "images_per_sec": results,
            "ratios": ratios,
        },
    )
    plot(results, RESULTS / "threads.png")
    print(f"-> {path}, {RESULTS / 'threads.png'}")


if __name__ == "__main__":
    main()
