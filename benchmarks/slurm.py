"""compute=slurm on the local single-node Slurm (scripts/local_slurm.sh): how long until a job
runs, how often ddlkit asks the scheduler while following one, and a sweep against compute=local.

* **submit -> running**: from starting ``ddlkit --detach framework=fake compute=slurm`` (the real
  CLI, its interpreter start-up, composing and validating included) to the batch script's first
  line in ``slurm.log`` (the job runs on the node) and to rank 0's first line (the ranks run);
* **scheduler calls per job-minute**: a job that prints for ``--follow-s`` seconds, followed as
  ``ddlkit`` follows one (``logs(follow=True)`` then ``wait()``) with the default
  ``compute.poll_interval_s``; every ``sbatch``/``scontrol``/``scancel``/``sinfo`` counted;
* **sweep**: the same ``ddlkit -m`` of ``--jobs`` short fake trainings (``framework.step_delay_s``
  makes each last about 2 s) on ``compute=local`` and on ``compute=slurm`` (default
  ``compute.poll_interval_s``, 5 s, and 1 s), ``sweep.max_parallel=2`` (the default);
  ratio = slurm wall time / local wall time.

    python benchmarks/slurm.py [--rounds 3 --jobs 6 --follow-s 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import summary, write_result

from ddlkit.jobdir import JOB_FILE

REPO = Path(__file__).resolve().parents[1]
FAKES = ("DDLKIT_PLUGINS", "ddlkit.testing.fakes")


def ensure_cluster() -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "local_slurm.sh"), "start"], capture_output=True, text=True, check=True
    )
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    os.environ["SLURM_CONF"] = conf
    return conf


def env() -> dict[str, str]:
    return {**os.environ, FAKES[0]: FAKES[1]}


def wait_for_text(path: Path, text: str, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in path.read_text(errors="replace"):
                return time.monotonic()
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"{text!r} not in {path} within {timeout} s")


def time_to_running(base: Path, i: int) -> dict[str, float]:
    job_dir = base / f"start-{i}"
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "ddlkit", "--detach", "framework=fake", "compute=slurm", f"hydra.run.dir={job_dir}"],
        env=env(),
        check=True,
        capture_output=True,
        cwd=base,
    )
    submitted = time.monotonic()
    script = wait_for_text(job_dir / "slurm.log", "ddlkit-slurm: job")
    rank0 = wait_for_text(job_dir / "slurm.log", "ddlkit: fake")
    wait_for_text(job_dir / "slurm.log", "ranks ended")
    return {"cli_returned_s": submitted - t0, "script_running_s": script - t0, "rank0_running_s": rank0 - t0}


def calls_per_minute(base: Path, follow_s: float) -> dict[str, float]:
    from ddlkit.interfaces import JobSpec
    from ddlkit_slurm import target as slurm

    tgt = slurm.SlurmTarget(slurm.SlurmConfig())
    job_dir = base / "follow"
    job_dir.mkdir()
    (job_dir / JOB_FILE).write_text("{}")
    code = f"import time\nfor i in range({int(follow_s * 2)}):\n    print('tick', i, flush=True); time.sleep(0.5)"
    before = slurm.SCHEDULER_CALLS["count"]
    t0 = time.monotonic()
    handle = tgt.submit(JobSpec(name="follow", job_dir=job_dir, args=("-c", code)))
    for _ in handle.logs(follow=True):
        pass
    status = handle.wait()
    elapsed = time.monotonic() - t0
    calls = slurm.SCHEDULER_CALLS["count"] - before
    assert status.state.value == "succeeded", status
    return {
        "poll_interval_s": tgt.cfg.poll_interval_s,
        "followed_s": elapsed,
        "scheduler_calls": calls,
        "calls_per_job_minute": calls / (elapsed / 60),
    }


def sweep(base: Path, name: str, jobs: int, extra: list[str]) -> float:
    sweep_dir = base / name
    args = [
        sys.executable,
        "-m",
        "ddlkit",
        "-m",
        "framework=fake",
        "framework.step_delay_s=0.02",
        f"trainer.seed={','.join(str(s) for s in range(1, jobs + 1))}",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]
    t0 = time.monotonic()
    subprocess.run(args, env=env(), check=True, capture_output=True, cwd=base)
    wall = time.monotonic() - t0
    ledger = json.loads((sweep_dir / "ledger.json").read_text())
    assert all(j["status"] == "completed" for j in ledger["jobs"].values()), ledger
    return wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--follow-s", type=float, default=30.0)
    args = parser.parse_args()
    ensure_cluster()
    with tempfile.TemporaryDirectory(prefix="ddlkit-bench-slurm-") as tmp:
        base = Path(tmp)
        starts = [time_to_running(base, i) for i in range(args.rounds)]
        follow = calls_per_minute(base, args.follow_s)
        local, slurm_default, slurm_fast = [], [], []
        for r in range(args.rounds):  # alternating, so drift in machine load hits all alike
            local.append(sweep(base, f"local-{r}", args.jobs, ["compute=local"]))
            slurm_default.append(sweep(base, f"slurm-{r}", args.jobs, ["compute=slurm"]))
            slurm_fast.append(sweep(base, f"slurm-fast-{r}", args.jobs, ["compute=slurm", "compute.poll_interval_s=1"]))

    def med(xs: list[float]) -> float:
        return summary(xs)["median"]

    payload = {
        "cluster": "scripts/local_slurm.sh: one node declaring 8 CPUs on this machine, sched_interval=2",
        "submit_to_running": {k: summary([s[k] for s in starts]) for k in starts[0]},
        "following": follow,
        "sweep": {
            "jobs": args.jobs,
            "max_parallel": 2,
            "local_s": summary(local),
            "slurm_s": summary(slurm_default),
            "slurm_poll_1s_s": summary(slurm_fast),
            "ratio_slurm_over_local": med(slurm_default) / med(local),
            "ratio_slurm_poll_1s_over_local": med(slurm_fast) / med(local),
        },
    }
    path = write_result("slurm", payload)
    print(json.dumps(payload, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
