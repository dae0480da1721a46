"""Time to the first step of a multi-rank job, phase by phase (issue 29, item 4).

Runs the real ``ddlkit`` command (``compute=local_mpi``, 2 ranks by default, ``trainer.max_steps=1``)
``--rounds`` times and splits each run's time from launching ``ddlkit`` to rank 0's first step done
with the phases rank 0 records in ``result.json``'s ``startup_s`` (seconds since its process
started; ``started_at`` places that start on the launcher's clock):

* ``launcher + mpirun``: the ``ddlkit`` command (compose, prepare the job) and mpirun, until rank 0's process exists;
* ``interpreter + ddlkit imports``: until the worker's ``main`` runs;
* ``rendezvous``: the ranks connect (``ranks connected``);
* ``plugins``: entry points loaded, the config rebuilt (``plugins loaded``);
* ``framework import``: torch / TensorFlow imported in the framework's ``train`` (``framework imported``);
* ``model build``; PyTorch: ``optimizer`` (torch imports torch._dynamo when an optimizer is first
  used: torch's cost, in any training script), ``replicas`` (DDP/Horovod give every rank rank 0's
  weights: the ranks wait for the slowest), ``output check`` (the model's first forward pass, on two
  samples); ``data`` (the loaders: data=synthetic generates its pool), ``first step``.

It also times importing the framework alone in a fresh interpreter (``framework_import_alone_s``):
the goal is a time to the first step within that plus 2 s (``goal_s``).

    python benchmarks/first_step.py [--framework pytorch] [--ranks 2] [--rounds 3] [--model resnet18] [--before REF]

With ``--before REF`` the same runs also happen on the code at git REF (interleaved), whose
result.json has no ``startup_s`` when REF predates it: only its total is compared then.
Writes benchmarks/results/first_step.json and first_step.png. About 30 s per run on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, core_env, export, summary, write_result

#: (label, the phase it ends at); each phase starts where the one before it ended
PHASES = (
    ("interpreter + ddlkit imports", "worker started"),
    ("rendezvous", "ranks connected"),
    ("plugins", "plugins loaded"),
    ("framework import", "framework imported"),
    ("model build", "model built"),
    ("optimizer (torch imports torch._dynamo)", "optimizer built"),
    ("replicas (rank 0's weights to all: waits for the slowest rank)", "replicas synchronized"),
    ("output check (the first forward pass)", "output checked"),
    ("data", "data ready"),
    ("first step", "first step done"),
)
#: what each framework's ranks import (framework=keras trains several ranks only with Horovod: not here)
IMPORTS = {"pytorch": "import torch", "tensorflow": "import tensorflow, keras"}


def one_run(args: argparse.Namespace, job_dir: Path, env: dict[str, str] | None) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "ddlkit",
        f"framework={args.framework}",
        f"model={args.model}",
        "data=synthetic",
        f"data.image_size={args.image_size}",
        f"trainer.batch_size={args.batch}",
        "trainer.max_steps=1",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.log_every=1",
        "compute=local_mpi",
        f"compute.procs_per_node={args.ranks}",
        "dist=native",
        f"hydra.run.dir={job_dir}",
    ]
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"ddlkit failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    result = json.loads((job_dir / "result.json").read_text())
    first = json.loads((job_dir / "metrics.jsonl").read_text().splitlines()[0])
    out: dict[str, Any] = {"to_first_step_s": first["time"] - start}
    if startup := result.get("startup_s"):
        out["launcher + mpirun"] = startup["started_at"] - start
        before = 0.0
        for label, phase in PHASES:
            if phase in startup:  # a framework records the phases it has
                out[label] = startup[phase] - before
                before = startup[phase]
    return out


def import_seconds(framework: str) -> float:
    code = f"import time; t = time.perf_counter(); {IMPORTS[framework]}; print(time.perf_counter() - t)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def plot(breakdown: dict[str, float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2.6))
    left = 0.0
    for label, seconds in breakdown.items():
        ax.barh([0], [seconds], left=left, label=f"{label} {seconds:.2f} s")
        left += seconds
    ax.set_yticks([])
    ax.set_xlabel("seconds from launching ddlkit (medians)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", default="pytorch", choices=sorted(IMPORTS))
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", metavar="REF", help="also run the code at git REF, interleaved")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        env_before = core_env(export(args.before, Path(tmp) / "before")) if args.before else None
        for r in range(args.rounds):  # interleaved, so drift hits both alike
            runs.append(one_run(args, Path(tmp) / f"now{r}", None))
            if args.before:
                before.append(one_run(args, Path(tmp) / f"before{r}", env_before))
            print(
                f"round {r + 1}: {runs[-1]['to_first_step_s']:.1f} s"
                + (f" (before: {before[-1]['to_first_step_s']:.1f} s)" if before else ""),
                flush=True,
            )
    framework_import = statistics.median(import_seconds(args.framework) for _ in range(args.rounds))
    breakdown = {k: statistics.median(run[k] for run in runs) for k in runs[0] if k != "to_first_step_s"}
    total = statistics.median(run["to_first_step_s"] for run in runs)
    payload = {
        "benchmark": "first_step",
        "config": vars(args),
        "to_first_step_s": summary([run["to_first_step_s"] for run in runs]),
        "breakdown_median_s": breakdown,
        "runs": runs,
        "framework_import_alone_s": framework_import,
        "goal_s": framework_import + 2.0,
        **(
            {
                "before": {
                    "ref": args.before,
                    "to_first_step_s": summary([b["to_first_step_s"] for b in before]),
                    "runs": before,
                }
            }
            if before
            else {}
        ),
    }
    path = write_result("first_step", payload)
    plot(
        breakdown,
        RESULTS / "first_step.png",
        f"{args.framework} {args.model}, {args.ranks} ranks on local_mpi: {total:.1f} s to the first step",
    )
    for label, seconds in breakdown.items():
        print(f"{label:30s} {seconds:6.2f} s")
    print(
        f"to the first step: {total:.1f} s (median of {len(runs)}); {args.framework} import alone "
        f"{framework_import:.1f} s, goal <= {framework_import + 2:.1f} s -> {path}"
    )


if __name__ == "__main__":
    main()
