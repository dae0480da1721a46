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
  trial for good (its ASHA does not pause and resume). Tune runs with ``reuse_actors=True``, its own
  setting for quick trial turnover: without it every trial starts a new Ray worker process first (on a
  busy 2-core machine that doubled Tune's wall time in the --quick grid, idle slots 46 % against 15 %).
  Ray's start (``ray.init``) is not in its wall time; ``ddlkit -m``'s CLI start-up is in ddlkit's.

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
as good as Ray Tune's ASHA in <= 1.1x its wall time; each is printed with "met" or "MISSED" (of the
medians) and kept in the JSON's ``goals``.

After each variant the script counts the trial processes still running (a command line naming the
variant's directory, or a working directory in it): ``stray_processes`` in the JSON, a warning if any.
The JSON's ``quiet`` is false for a smoke run (``--quick``, fewer than 3 rounds, or a 1-minute load
average >= 0.5 before it started): such figures prove the script works, they measure nothing.

    pip install 'ray[tune]'        # the Ray Tune baseline (pip install -e '.[bench]')
    python benchmarks/early_stopping.py [--rounds 3] [--quick] [--variants full,asha,median,ray_tune_asha]

Writes ``benchmarks/results/early_stopping.json`` and ``early_stopping.png``; a partial run (--quick,
fewer than 3 rounds, or not every variant) writes ``early_stopping-smoke.json`` and ``.png`` instead.
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
#: issue 40's goals: ratio name -> (bound, "<=" or ">="), checked on the ratio's median
GOALS = {
    "asha_trial_s_vs_full": (0.40, "<="),
    "asha_best_minus_full_best": (-0.01, ">="),
    "asha_idle_share": (0.05, "<="),
    "asha_wall_vs_ray_tune_asha": (1.1, "<="),
    "asha_best_minus_ray_tune_best": (0.0, ">="),
}


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
        # Tune's old console output, which verbose=0 silences (the new one prints a table regardless)
        "RAY_AIR_NEW_OUTPUT": "0",
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
            "sweep.early_stopping.mode=max",
            "sweep.early_stopping.unit=epochs",
            f"sweep.early_stopping.grace={GRACE}",
            f"sweep.early_stopping.reduction_factor={FACTOR}",
            f"sweep.early_stopping.max_t={MAX_T}",
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
    strays = stray_processes(sweep)
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
        "stray_processes": strays,
        # the slots idle from the first trial's start to the last one's end (the CLI's start-up and the
        # report at the end left out): what the scheduling itself leaves idle
        "idle_share_running": max(0.0, 1 - busy / (2 * span)),
    }


def stray_processes(directory: Path) -> int:
    """Processes still running that belong to a trial under ``directory`` (left behind): their command
    line names it (``ddlkit ... hydra.run.dir=...``) or they run in it (the rank worker, in its job directory)."""
    needle, count = str(directory.resolve()), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = Path(entry.path, "cmdline").read_bytes().decode(errors="replace")
                count += needle in cmdline or os.readlink(Path(entry.path, "cwd")).startswith(needle)
    return count


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
    os.environ.update({k: v for k, v in env().items() if k.startswith("RAY_") or k == "DDLKIT_PLUGINS"})
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
            tune_config=tune.TuneConfig(
                metric=METRIC, mode="max", scheduler=scheduler, max_concurrent_trials=2, reuse_actors=True
            ),
            run_config=tune.RunConfig(storage_path=str(base / "ray_results"), verbose=0),
        )
        started = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - started
    finally:
        ray.shutdown()
    strays = stray_processes(tune_dir)
    finals = [r.metrics[METRIC] for r in results if r.metrics and r.metrics.get("epoch") == MAX_T]
    busy = sum(float(p.read_text()) for p in (tune_dir / "times").iterdir())
    return {
        "best": max(finals),
        "trial_s": busy,
        "wall_s": wall,
        "full_budget_trials": len(finals),
        "stray_processes": strays,
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
    # 1-minute load average (2 cores) before anything runs, then after each round
    load = [os.getloadavg()[0]]
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
        load.append(os.getloadavg()[0])

    def ratio(a: str, b: str, key: str) -> list[float]:
        return [r[a][key] / r[b][key] for r in rounds if a in r and b in r]

    def minus(a: str, b: str, key: str) -> list[float]:
        return [r[a][key] - r[b][key] for r in rounds if a in r and b in r]

    ratios = {
        name: summary(samples)
        for name, samples in {
            "asha_trial_s_vs_full": ratio("asha", "full", "trial_s"),
            "median_trial_s_vs_full": ratio("median", "full", "trial_s"),
            "asha_best_minus_full_best": minus("asha", "full", "best"),
            "median_best_minus_full_best": minus("median", "full", "best"),
            "asha_wall_vs_ray_tune_asha": ratio("asha", "ray_tune_asha", "wall_s"),
            "asha_best_minus_ray_tune_best": minus("asha", "ray_tune_asha", "best"),
            "asha_idle_share": [r["asha"]["idle_share"] for r in rounds if "asha" in r],
            "asha_idle_share_running": [r["asha"]["idle_share_running"] for r in rounds if "asha" in r],
        }.items()
        if samples
    }
    goals = {}
    for key, value in ratios.items():
        verdict = ""
        if key in GOALS and value["samples"]:
            bound, way = GOALS[key]
            met = value["median"] <= bound if way == "<=" else value["median"] >= bound
            goals[key] = {"goal": f"{way} {bound}", "met": met}
            verdict = f"  goal {way} {bound}: {'met' if met else 'MISSED'}"
        samples_text = ", ".join(f"{v:.4f}" for v in value["samples"])
        print(f"{key}: median {value['median']:.4f} (rounds: {samples_text}){verdict}")
    strays = sum(m.get("stray_processes", 0) for r in rounds for m in r.values())
    if strays:
        print(f"WARNING: {strays} trial process(es) outlived their variant's run", flush=True)
    partial = args.quick or args.rounds < 3 or set(variants) != {"full", "asha", "median", "ray_tune_asha"}
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
        # a smoke run (partial, or on a busy machine before it started) is no measurement
        "quiet": not partial and load[0] < 0.5,
        "load_average": load,
        "rounds": rounds,
        "ratios": ratios,
        "goals": goals,
        "medians": {
            v: {k: statistics.median(r[v][k] for r in rounds) for k in ("best", "trial_s", "wall_s", "idle_share")}
            for v in variants
        },
    }
    path = write_result("early_stopping" + ("-smoke" if partial else ""), payload)
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
