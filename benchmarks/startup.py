"""Start-up cost of the ``ddlkit`` command, and proof that composing never imports a framework.

Times ``ddlkit --cfg job`` (load plugins, store schemas, compose, print) against two baselines
run in the same script: a bare interpreter, and a minimal Hydra app that composes and prints a
one-key config (the floor any Hydra CLI pays). Reports medians and ddlkit's extra seconds over
the Hydra floor, and which heavy modules ``ddlkit --cfg job`` imported (from ``-X importtime``).

    python benchmarks/startup.py [--repeat 5] [--before REF]

With ``--before REF`` the same command also runs on the core as it was at git REF (its ``ddlkit``
and plugins first on ``PYTHONPATH``), interleaved with the others, and the JSON gains the ratio
before / now.

With ``--instructions`` each command also runs once under ``valgrind --tool=callgrind``, and the JSON
gains the instructions each executed (``instructions``, and ``ratio_instructions_ddlkit_to_hydra_floor``):
a count that other work on the machine does not change, for a busy machine (it leaves out what
waits on the disk; about a minute per command).

Run it with bytecode caching on, as users' environments have it: where PYTHONDONTWRITEBYTECODE
is set, ddlkit's editable modules are compiled again at every start (``env -u
PYTHONDONTWRITEBYTECODE python benchmarks/startup.py``); the result records which it was.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import core_env, export, write_result

HYDRA_APP = """
import hydra
from omegaconf import OmegaConf
@hydra.main(version_base="1.3", config_path=None, config_name=None)
def app(cfg):
    pass
app()
"""
HEAVY = ("torch", "tensorflow", "keras", "jax", "horovod", "wandb", "azure")


def timed(argv: list[str], cwd: str, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def instructions(argv: list[str], cwd: str, env: dict[str, str] | None = None) -> int:
    """The instructions ``argv`` executes (callgrind's count, the interpreter's own process: the
    ``python`` on PATH may be a shim that execs it)."""
    real = subprocess.run(
        [argv[0], "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", real, *argv[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return int(re.search(r"Collected : (\d+)", proc.stderr).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", metavar="REF", help="also time ddlkit --cfg job on the core at git REF")
    ap.add_argument("--instructions", action="store_true", help="also count each command's instructions (valgrind)")
    args = ap.parse_args()
    if args.instructions and not shutil.which("valgrind"):
        ap.error("--instructions needs valgrind: apt-get install valgrind")
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "app.py"
        app.write_text(HYDRA_APP)
        cases = {
            "python": [sys.executable, "-c", "pass"],
            "hydra_minimal_app": [sys.executable, str(app), "--cfg", "job"],
            "ddlkit_cfg_job": [sys.executable, "-m", "ddlkit", "--cfg", "job"],
        }
        envs: dict[str, dict[str, str] | None] = dict.fromkeys(cases)
        if args.before:
            cases["ddlkit_cfg_job_before"] = cases["ddlkit_cfg_job"]
            envs["ddlkit_cfg_job_before"] = core_env(export(args.before, Path(tmp) / f"before-{args.before}"))
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.repeat):  # interleaved, so drift hits all cases alike
            for name, argv in cases.items():
                samples[name].append(timed(argv, tmp, envs[name]))
        counts = (
            {name: instructions(argv, tmp, envs[name]) for name, argv in cases.items()} if args.instructions else {}
        )
        trace = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "ddlkit", "--cfg", "job"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    imported = sorted({ln.split("|")[-1].strip().split(".")[0] for ln in trace.splitlines() if "|" in ln})
    heavy = [m for m in HEAVY if m in imported]
    med = {k: statistics.median(v) for k, v in samples.items()}
    payload = {
        "benchmark": "startup",
        "repeat": args.repeat,
        "median_s": med,
        "samples_s": samples,
        "ddlkit_over_hydra_floor_s": med["ddlkit_cfg_job"] - med["hydra_minimal_app"],
        "ratio_ddlkit_to_hydra_floor": med["ddlkit_cfg_job"] / med["hydra_minimal_app"],
        "heavy_modules_imported": heavy,
        **(
            {
                "instructions": counts,
                "ratio_instructions_ddlkit_to_hydra_floor": counts["ddlkit_cfg_job"] / counts["hydra_minimal_app"],
            }
            if counts
            else {}
        ),
        # with PYTHONDONTWRITEBYTECODE set, ddlkit's editable modules are compiled on every start
        # (~0.3 s); users' environments cache bytecode, so measure with it (see the docstring)
        "bytecode_cached": not sys.flags.dont_write_bytecode,
        **(
            {
                "before": {
                    "ref": args.before,
                    "ratio_before_over_now": med["ddlkit_cfg_job_before"] / med["ddlkit_cfg_job"],
                }
            }
            if args.before
            else {}
        ),
    }
    path = write_result("startup", payload)
    for k, v in med.items():
        print(f"{k:20s} {v:.3f} s")
    for k, v in counts.items():
        print(f"{k:20s} {v / 1e9:.3f} G instructions")
    print(
        f"ddlkit --cfg job costs {payload['ddlkit_over_hydra_floor_s']:.3f} s over a minimal Hydra app; "
        f"heavy modules imported: {heavy or 'none'} -> {path}"
    )


if __name__ == "__main__":
    main()
