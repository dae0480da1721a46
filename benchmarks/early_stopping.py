"""A 16-config grid (4 learning rates x 4 batch sizes), 9 epochs a trial, 2 trials at once:
every trial to its end against ddlkit's early stopping (asha, median) and Ray Tune's ASHAScheduler.

Four variants, in one script, on one machine, alternating their order between rounds:

* ``full``: ``ddlkit -m`` over the grid, every trial to its end (the baseline of compute);
* ``asha``: the same with ``sweep.early_stopping.scheduler=asha`` (grace 1 epoch, reduction factor 3:
  rungs at 1 and 3 of 9 epochs), trials paused at a rung and promoted by resuming their checkpoint;
* ``median``: ``sweep.early_stopping.scheduler=median`` (the same milestones, min_samples 3);
* ``ray_tune_asha``: the same trials under Ray Tune's ``ASHAScheduler`` (``time_attr=epoch``, the same
  grace, reduction factor and max_t, metric and mode), 2 trials at once (1 CPU each). Its trainable
  runs the same ddlkit job (``python -m ddlkit <the trial's overrides>`` with the full 9 epochs) and
  reports each validation of the job's metrics.jsonl to Tune as it appears; a trial Tune stops is
  killed with its process group. This is what a ddlkit user would write to use Tune; Tune stops a
  trial for good (its ASHA does not pause and resume). Ray's start (``ray.init``) is not in its wall
  time; ``ddlkit -m``'s CLI start-up is in ddlkit's.

The trainable: ddlkit's ``framework=fake`` (momentum SGD on a softmax regression, float64, numpy,
deterministic) on ``_tuning_data:noisy_classes`` (16 classes of 8x8x3 patterns under noise, 131,072
training samples: an epoch takes 0.6-3.5 s by batch size on one core), one thread a trial. A real
learning problem, not a sleep; chosen over a small ResNet so that a round of the full grid takes
about 3 minutes on 2 cores, and so that start-up (about 2.5 s a job, which every segment of an early-
stopped trial pays again) weighs as it does for short trials.

Reported per variant and round: the best trial's metric at the full budget (of the trials that
reached it: the one the method would pick), trial-seconds (the seconds the trials' processes ran:
ddlkit's from the ledger's segments, Tune's measured around each trial's process), wall time, and
the idle-slot share (1 - trial-seconds / (2 slots x wall time); for ddlkit also over the span from the
first trial's start to the last one's end, which leaves the CLI's start-up out). Goals (issue 40): asha within 0.01
of the full grid's best with <= 40 % of its trial-seconds and <= 5 % idle; ddlkit's asha at least
as good as Ray Tune's ASHA in <= 1.1x its wall time.

    pip install 'ray[tune]'        # the Ray Tune baseline (pip install -e '.[bench]')
    python benchmarks/early_stopping.py [--rounds 3] [--quick]

Writes ``benchmarks/results/early_stopping.json`` and ``early_stopping.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import summary, write_result

HERE = Path(__file__).resolve().parent
LRS = ("0.0003", "0.003", "0.03", "0.3")
BATCHES = ("32", "64", "128", "256")
MAX_T, GRACE, FACTOR, METRIC = 9, 1, 3, "val_top1"


def trial_args(samples: int) -> list[str]:
    """What every trial of the grid shares."""
    return [
        "framework=fake",
        "framework.side=8",
        "logger=[jsonl]",
        "data=custom",
        "data.target=_tuning_data:noisy_classes",
        "data.num_classes=16",
        "data.image_size=8",
        f"+data.kwargs.n={samples}",
        "trainer.save_model=false",
        "trainer.keep_checkpoints=1",
        f"trainer.epochs={MAX_T}",
    ]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "DDLKIT_PLUGINS": "ddlkit.testing.fakes",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


# ------------------------------------------------------------------------------------------ ddlkit
def run_ddlkit(variant: str, base: Path, samples: int) -> dict[str, Any]:
    sweep = base / variant
    stopping = (
        []
        if variant == "full"
        else [
            f"sweep.early_stopping.scheduler={variant}",
            f"sweep.early_stopping.metric={METRIC}",
            f"sweep.early_stopping.grace={GRACE}",
            f"sweep.early_stopping.reduction_factor={FACTOR}",
        ]
    )
    args = [
        "-m",
        *trial_args(samples),
        f"optimizer.lr={','.join(LRS)}",
        f"trainer.batch_size={','.join(BATCHES)}",
        "sweep.max_parallel=2",
        *stopping,
        f"hydra.sweep.dir={sweep}",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ddlkit", *args],
        cwd=base,
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"ddlkit -m ({variant}) exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    jobs = json.loads((sweep / "ledger.json").read_text())["jobs"].values()
    runs = [r for job in jobs for r in (job.get("segments") or [{"started": job["started"], "ended": job["ended"]}])]
    busy = sum(r["ended"] - r["started"] for r in runs)
    span = max(r["ended"] for r in runs) - min(r["started"] for r in runs)
    finals = {}
    for job in jobs:
        values = last_values(Path(job["job_dir"]))
        if values and max(values) >= MAX_T:
            finals[job["num"]] = values[max(values)]
    return {
        "best": max(finals.values()),
        "trial_s": busy,
        "wall_s": wall,
        "full_budget_trials": len(finals),
        # the slots idle from the first trial's start to the last one's end (the CLI's start-up and the
        # report at the end left out): what the scheduling itself leaves idle
        "idle_share_running": max(0.0, 1 - busy / (2 * span)),
    }


def last_values(job_dir: Path) -> dict[int, float]:
    """The metric at the end of each epoch the job validated."""
    values = {}
    for line in (job_dir / "metrics.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("split") == "val" and METRIC in record:
                values[round(record["epoch"])] = record[METRIC]
    return values


# ------------------------------------------------------------------------------------------ Ray Tune
def _die_with_parent() -> None:
    """The trial's job dies with the Tune worker thread that started it (PR_SET_PDEATHSIG)."""
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def tune_trainable(config: dict[str, Any]) -> None:
    from ray import tune

    trial_dir = Path(config["base"]) / f"lr{config['lr']}-b{config['batch']}"
    args = [
        *trial_args(config["samples"]),
        f"optimizer.lr={config['lr']}",
        f"trainer.batch_size={config['batch']}",
        f"hydra.run.dir={trial_dir}",
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args],
        cwd=config["base"],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    metrics, seen = trial_dir / "metrics.jsonl", 0
    try:
        while True:
            lines = metrics.read_text().splitlines() if metrics.is_file() else []
            for line in lines[seen:]:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("split") == "val":
                        tune.report({METRIC: record[METRIC], "epoch": round(record["epoch"])})
            seen = len(lines)
            if proc.poll() is not None:
                return
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        (Path(config["base"]) / "times").mkdir(exist_ok=True)
        (Path(config["base"]) / "times" / trial_dir.name).write_text(str(time.perf_counter() - started))


def run_tune(base: Path, samples: int) -> dict[str, Any]:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    tune_dir = base / "ray_tune_asha"
    tune_dir.mkdir()
    os.environ.update({k: v for k, v in env().items() if k in ("DDLKIT_PLUGINS", "RAY_USAGE_STATS_ENABLED")})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        scheduler = ASHAScheduler(
            time_attr="epoch",
            max_t=MAX_T,
            grace_period=GRACE,
            reduction_factor=FACTOR,
            brackets=1,
        )
        space = {
            "lr": tune.grid_search(list(LRS)),
            "batch": tune.grid_search(list(BATCHES)),
            "base": str(tune_dir),
            "samples": samples,
        }
        tuner = tune.Tuner(
            tune.with_resources(tune_trainable, {"cpu": 1}),
            param_space=space,
            tune_config=tune.TuneConfig(metric=METRIC, mode="max", scheduler=scheduler, max_concurrent_trials=2),
            run_config=tune.RunConfig(storage_path=str(base / "ray_results"), verbose=0),
        )
        started = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - started
    finally:
        ray.shutdown()
    finals = [r.metrics[METRIC] for r in results if r.metrics and r.metrics.get("epoch") == MAX_T]
    busy = sum(float(p.read_text()) for p in (tune_dir / "times").iterdir())
    return {
        "best": max(finals),
        "trial_s": busy,
        "wall_s": wall,
        "full_budget_trials": len(finals),
    }


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="32,768 samples an epoch instead of 131,072 (a smoke run)",
    )
    parser.add_argument("--variants", default="full,asha,median,ray_tune_asha")
    args = parser.parse_args()
    samples = 32768 if args.quick else 131072
    variants = args.variants.split(",")
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        order = variants if number % 2 == 0 else variants[::-1]
        measured: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="ddlkit-es-") as tmp:
            for variant in order:
                base = Path(tmp)
                measured[variant] = (
                    run_tune(base, samples) if variant == "ray_tune_asha" else run_ddlkit(variant, base, samples)
                )
                m = measured[variant]
                m["idle_share"] = max(0.0, 1 - m["trial_s"] / (2 * m["wall_s"]))
                print(
                    f"round {number + 1} {variant:14s} best {METRIC} {m['best']:.4f}  trial-s {m['trial_s']:7.1f}  "
                    f"wall {m['wall_s']:6.1f} s  idle {m['idle_share']:.1%}"
                    + (f" ({m['idle_share_running']:.1%} while trials ran)" if "idle_share_running" in m else "")
                    + f"  ({m['full_budget_trials']} to {MAX_T} epochs)",
                    flush=True,
                )
        rounds.append(measured)

    def ratio(a: str, b: str, key: str) -> list[float]:
        return [r[a][key] / r[b][key] for r in rounds if a in r and b in r]

    ratios = {
        "asha_trial_s_vs_full": summary(ratio("asha", "full", "trial_s")),
        "median_trial_s_vs_full": summary(ratio("median", "full", "trial_s")),
        "asha_best_minus_full_best": summary([r["asha"]["best"] - r["full"]["best"] for r in rounds if "full" in r]),
        "asha_wall_vs_ray_tune_asha": summary(ratio("asha", "ray_tune_asha", "wall_s")),
        "asha_best_minus_ray_tune_best": summary(
            [r["asha"]["best"] - r["ray_tune_asha"]["best"] for r in rounds if "ray_tune_asha" in r]
        ),
        "asha_idle_share": summary([r["asha"]["idle_share"] for r in rounds if "asha" in r]),
        "asha_idle_share_running": summary([r["asha"]["idle_share_running"] for r in rounds if "asha" in r]),
    }
    for key, value in ratios.items():
        print(f"{key}: median {value['median']:.3f} (rounds: {', '.join(f'{v:.3f}' for v in value['samples'])})")
    payload = {
        "grid": {
            "lr": LRS,
            "batch_size": BATCHES,
            "max_t_epochs": MAX_T,
            "grace": GRACE,
            "reduction_factor": FACTOR,
        },
        "samples_per_epoch": samples,
        "quick": args.quick,
        "rounds": rounds,
        "ratios": ratios,
        "medians": {
            v: {k: statistics.median(r[v][k] for r in rounds) for k in ("best", "trial_s", "wall_s", "idle_share")}
            for v in variants
        },
    }
    path = write_result("early_stopping" + ("-quick" if args.quick else ""), payload)
    plot(payload, path.with_suffix(".png"))
    print(f"wrote {path}")


def plot(payload: dict[str, Any], path: Path) -> None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return
    medians = payload["medians"]
    names = list(medians)
    fig = Figure(figsize=(9, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, key, title in (
        (left, "trial_s", "trial-seconds"),
        (right, "wall_s", "wall time (s)"),
    ):
        bars = ax.bar(
            names,
            [medians[n][key] for n in names],
            color=["grey", "tab:blue", "tab:green", "tab:orange"],
        )
        for bar, name in zip(bars, names, strict=True):
            ax.annotate(
                f"best {medians[name]['best']:.3f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(f"{title}, median of {len(payload['rounds'])} rounds", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("16-config grid, 9 epochs a trial, 2 at once: early stopping", fontsize=10)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
