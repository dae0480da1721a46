"""compute=ray on a local Ray cluster of simulated nodes (``ddlkit_ray.testing.LocalRayCluster``:
``ray start`` on 127.0.0.1), each figure beside its baseline on the same cluster:

* **(a) submit -> first step, and step rate**: a 2-rank ResNet-18 job (PyTorch, ``dist=native``,
  synthetic data, ``--steps`` steps of ``--batch`` images of ``--image-size`` pixels per rank), one
  rank per node: from starting ``ddlkit ... compute=ray`` (the real CLI) to rank 0's "first step
  done" line on the launcher's console, and images/sec from ``result.json`` (warm-up excluded);
  the same job on ``compute=local_mpi`` (2 simulated nodes, mpirun on this machine); and Ray
  Train's ``TorchTrainer`` running the same model and loop (SGD, DDP, the same synthetic batches)
  with 2 workers on the same cluster (needs ``pip install 'ray[train]==<ray's version>'``);
  ratios: ray / local_mpi, ray / TorchTrainer;
* **(b) node-loss recovery**: a 3-node cluster, the same job on 2 nodes with a checkpoint every
  ``--checkpoint-every`` steps; after step 20 a node of the job that is not the head is killed (its raylet, SIGKILL);
  measured: from the kill to rank 0's first step after the restart (ddlkit's restart policy,
  ``restart.backoff_s=0``), and to the job's end. Baseline: ``TorchTrainer`` with
  ``FailureConfig(max_failures=1)``, a node of one of its workers killed the same way: from the
  kill to the restarted workers' first step;
* **(c) a 4-job sweep**: ``ddlkit -m ... compute=ray`` of 4 short fake trainings (one CPU each, the
  cluster has ``--cpus-per-node`` x 2) vs the same 4 jobs run as plain ``ray.remote`` tasks (each
  runs the ddlkit job with ``compute=local`` on a node of the cluster); ratio = ray / tasks.

    python benchmarks/ray.py [--steps 60 --rounds 1 --cpus-per-node 2] [--skip a,b,c] [--quick]

``--quick`` trains the fake framework instead of ResNet-18 (seconds; to check the script runs).
Writes benchmarks/results/ray.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# this file's name is Ray's: its directory goes last on the import path, so that `import ray` is Ray
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from _common import summary, write_result  # noqa: E402

REPO = HERE.parent
from ddlkit_ray.testing import LocalRayCluster  # noqa: E402

FIRST_STEP = "first step done"


def env() -> dict[str, str]:
    return {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes", "RAY_USAGE_STATS_ENABLED": "0"}


def job_overrides(args: argparse.Namespace) -> list[str]:
    if args.quick:
        return ["framework=fake", "framework.step_delay_s=0.05", f"trainer.max_steps={args.steps}", "trainer.epochs=10"]
    return ["framework=pytorch", "model=resnet18", "data=synthetic", f"data.image_size={args.image_size}",
            "data.num_classes=10", f"trainer.batch_size={args.batch}", f"trainer.max_steps={args.steps}",
            "trainer.epochs=100", "framework.num_threads=1"]


class Launcher:
    """``ddlkit`` in a subprocess, its console read line by line with the time each line came."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "ddlkit", *argv], cwd=cwd, env=env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def when(self, text: str, after: float = 0.0, timeout: float = 900) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if t >= after and text in line:
                    return t
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise RuntimeError(f"no {text!r} on the console: {''.join(l for _, l in self.lines)[-3000:]}")

    def finish(self, timeout: float = 1800) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code


def ddlkit_job(args: argparse.Namespace, base: Path, name: str, compute: list[str]) -> dict[str, Any]:
    job_dir = base / name
    run = Launcher([*job_overrides(args), "dist=native", *compute, f"hydra.run.dir={job_dir}"], base)
    first = run.when(FIRST_STEP) - run.t0
    code = run.finish()
    if code != 0:
        raise RuntimeError(f"{name} exited {code}: {''.join(l for _, l in run.lines)[-3000:]}")
    result = json.loads((job_dir / "result.json").read_text())
    return {"submit_to_first_step_s": first, "images_per_sec": result["images_per_sec"]}


# ---------------------------------------------------------------------------- Ray Train baselines
def _train_loop(config: dict[str, Any]) -> None:
    """Ray Train's worker: the model and loop ddlkit's PyTorch job runs (SGD with momentum, DDP
    through Ray Train, synthetic batches), timing steps after the warm-up."""
    import torch
    import ray.train
    import ray.train.torch
    from ddlkit_pytorch.models import resnet18

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    marks = Path(config["marks"])
    torch.manual_seed(ctx.get_world_rank())
    model = ray.train.torch.prepare_model(resnet18(num_classes=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(config["batch"], 3, config["image_size"], config["image_size"])
    y = torch.randint(0, 10, (config["batch"],))
    import ray as _ray
    (marks / f"node-{ctx.get_world_rank()}").write_text(_ray.get_runtime_context().get_node_id())
    warmup, t_start = 5, None
    for step in range(1, config["steps"] + 1):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if step == 1 and ctx.get_world_rank() == 0:
            with open(marks / "first-steps", "a") as f:
                f.write(f"{time.time()}\n")
        if step == warmup:
            t_start = time.perf_counter()
        if step > 20 and config.get("slow_after_20"):
            time.sleep(0.5)
    if ctx.get_world_rank() == 0 and t_start is not None:
        rate = (config["steps"] - warmup) * config["batch"] * ctx.get_world_size() / (time.perf_counter() - t_start)
        (marks / "rate").write_text(str(rate))


def ray_train(cluster: LocalRayCluster, args: argparse.Namespace, *, kill: bool = False) -> dict[str, Any]:
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError as exc:
        return {"skipped": f"Ray Train is not installed ({exc}): pip install 'ray[train]'"}
    marks = Path(tempfile.mkdtemp(prefix="ray-train-"))
    ray.init(address=cluster.gcs_address, ignore_reinit_error=True, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    config = {"batch": args.batch, "image_size": args.image_size, "steps": args.steps, "marks": str(marks),
              "slow_after_20": kill}
    trainer = TorchTrainer(_train_loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1},
                                                        placement_strategy="STRICT_SPREAD"),
                           run_config=RunConfig(storage_path=str(marks / "storage"),
                                                failure_config=FailureConfig(max_failures=1 if kill else 0)))
    t0 = time.time()
    out: dict[str, Any] = {}
    if kill:
        def killer() -> None:
            while not all((marks / f) .exists() for f in ("node-0", "node-1", "first-steps")):
                time.sleep(0.1)
            time.sleep(5)
            head = cluster.head_node_id()
            nodes = [(marks / f"node-{r}").read_text().strip() for r in (1, 0)]
            out["killed_at"] = time.time()
            cluster.kill_node(next(n for n in nodes if n != head))  # a worker's node, not the head
        threading.Thread(target=killer, daemon=True).start()
    trainer.fit()
    firsts = [float(x) for x in (marks / "first-steps").read_text().split()]
    out["submit_to_first_step_s"] = firsts[0] - t0
    if (marks / "rate").exists():
        out["images_per_sec"] = float((marks / "rate").read_text())
    if kill and len(firsts) > 1:
        out["kill_to_first_step_s"] = firsts[-1] - out["killed_at"]
    ray.shutdown()
    return out


# ---------------------------------------------------------------------------- the parts
def part_a(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with LocalRayCluster(nodes=2, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
        for r in range(args.rounds):
            ray_job = ddlkit_job(args, base, f"a-ray-{r}", ["compute=ray", f"compute.address={cluster.address}",
                                                           "compute.nodes=2", "compute.poll_interval_s=0.5"])
            mpi_job = ddlkit_job(args, base, f"a-mpi-{r}", ["compute=local_mpi", "compute.nodes=2"])
            train = {} if args.quick else ray_train(cluster, args)
            rounds.append({"ray": ray_job, "local_mpi": mpi_job, "ray_train": train})
            print(f"(a) round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    med = lambda who, key: summary([x[who][key] for x in rounds if key in x[who]])  # noqa: E731
    out: dict[str, Any] = {"rounds": rounds}
    for who in ("ray", "local_mpi", "ray_train"):
        for key in ("submit_to_first_step_s", "images_per_sec"):
            if any(key in x[who] for x in rounds):
                out[f"{who}_{key}"] = med(who, key)
    for other in ("local_mpi", "ray_train"):
        if f"{other}_images_per_sec" in out:
            out[f"ips_ratio_ray_over_{other}"] = (out["ray_images_per_sec"]["median"]
                                                  / out[f"{other}_images_per_sec"]["median"])
            out[f"first_step_ratio_ray_over_{other}"] = (out["ray_submit_to_first_step_s"]["median"]
                                                         / out[f"{other}_submit_to_first_step_s"]["median"])
    return out


def part_b(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with LocalRayCluster(nodes=3, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
        job_dir = base / "b-ray"
        run = Launcher([*job_overrides(args), "dist=native", "dist.timeout_s=30", "compute=ray",
                        f"compute.address={cluster.address}", "compute.nodes=2", "compute.poll_interval_s=0.5",
                        "compute.sync_interval_s=2", f"trainer.checkpoint_every={args.checkpoint_every}",
                        "trainer.log_every=5", "restart.backoff_s=0", f"hydra.run.dir={job_dir}"], base)
        started = run.when("started on node(s)")
        text = next(line for t, line in run.lines if t == started)
        found = re.search(r"0 \((\w+)\), 1 \((\w+)\)", text)
        # a node of the job that is not the head (whose loss ends the cluster)
        node = next(n for n in (found[2], found[1]) if not cluster.head_node_id().startswith(n))
        run.when("step 20/")
        killed = time.monotonic()
        cluster.kill_node(node)
        resumed = run.when(FIRST_STEP, after=killed)
        code = run.finish()
        result = json.loads((job_dir / "result.json").read_text()) if code == 0 else {}
        out["ddlkit"] = {"kill_to_first_step_s": resumed - killed, "kill_to_end_s": time.monotonic() - killed,
                         "exit": code, "restarts": result.get("restarts"),
                         "resumed_from_step": result.get("resumed_from_step"), "steps_lost": result.get("steps_lost")}
        print(f"(b) ddlkit: {json.dumps(out['ddlkit'])}", flush=True)
    if not args.quick:
        with LocalRayCluster(nodes=3, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
            out["ray_train"] = ray_train(cluster, args, kill=True)
            print(f"(b) Ray Train: {json.dumps(out['ray_train'])}", flush=True)
        if "kill_to_first_step_s" in out["ray_train"]:
            out["recovery_ratio_ddlkit_over_ray_train"] = (out["ddlkit"]["kill_to_first_step_s"]
                                                           / out["ray_train"]["kill_to_first_step_s"])
    return out


def _task(argv: list[str], cwd: str) -> int:
    return subprocess.run([sys.executable, "-m", "ddlkit", *argv], cwd=cwd, env=env(), capture_output=True).returncode


def part_c(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    lrs = ["0.1", "0.05", "0.02", "0.01"]
    fake = ["framework=fake", "framework.step_delay_s=0.05", "trainer.max_steps=40"]
    rounds = []
    with LocalRayCluster(nodes=2, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
        import ray

        for r in range(args.rounds):
            sweep_dir = base / f"c-sweep-{r}"
            t0 = time.monotonic()
            run = Launcher(["-m", *fake, "compute=ray", f"compute.address={cluster.address}",
                            "compute.poll_interval_s=0.5", f"optimizer.lr={','.join(lrs)}",
                            f"sweep.max_parallel={len(lrs)}", f"hydra.sweep.dir={sweep_dir}"], base)
            if run.finish() != 0:
                raise RuntimeError("".join(line for _, line in run.lines)[-3000:])
            ddlkit_s = time.monotonic() - t0
            ray.init(address=cluster.gcs_address, ignore_reinit_error=True, logging_level="WARNING")
            task = ray.remote(num_cpus=1)(_task)
            t0 = time.monotonic()
            codes = ray.get([task.remote([*fake, f"optimizer.lr={lr}", f"hydra.run.dir={base}/c-task-{r}-{i}"],
                                         str(base)) for i, lr in enumerate(lrs)])
            tasks_s = time.monotonic() - t0
            ray.shutdown()
            assert codes == [0] * len(lrs), codes
            rounds.append({"ddlkit_sweep_s": ddlkit_s, "ray_tasks_s": tasks_s})
            print(f"(c) round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    d, t = summary([x["ddlkit_sweep_s"] for x in rounds]), summary([x["ray_tasks_s"] for x in rounds])
    return {"rounds": rounds, "ddlkit_sweep_s": d, "ray_tasks_s": t, "ratio_ddlkit_over_tasks": d["median"] / t["median"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--cpus-per-node", type=int, default=2)
    parser.add_argument("--skip", default="", help="parts to leave out: a,b,c")
    parser.add_argument("--quick", action="store_true", help="the fake framework, no Ray Train: checks the script")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    base = Path(tempfile.mkdtemp(prefix="ddlkit-bench-ray-"))
    out: dict[str, Any] = {"args": vars(args)}
    for name, part in (("a", part_a), ("b", part_b), ("c", part_c)):
        if name not in skip:
            out[name] = part(args, base)
    path = write_result("ray" + ("-quick" if args.quick else ""), out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
