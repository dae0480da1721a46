"""compute=ray on a local Ray cluster of simulated nodes (``ddlkit_ray.testing.LocalRayCluster``:
``ray start`` on 127.0.0.1), each figure beside its baseline on the same cluster -- what issue 28 asks:

* **(a) submit -> first training step, and 2-rank images/sec**: a 2-rank ResNet-18 job (PyTorch,
  ``dist=native``, synthetic data, ``--steps`` steps of ``--batch`` images of ``--image-size`` pixels
  per rank), one rank per node, from starting ``ddlkit ... compute=ray`` (the real CLI) to rank 0's
  first step (its time in ``result.json``'s ``startup_s``; the "first step done" line's arrival on
  the launcher's console is kept too), and images/sec from ``result.json`` (warm-up excluded).
  Baselines on the same cluster: **a plain ``ray job submit``** (Ray's Jobs API, the real CLI) of a
  hand-written Ray training script of the same model and loop (``_ray_plain_job.py``: a placement
  group of one bundle per node, an actor per rank, DDP over gloo), from starting ``ray job submit``
  to its rank 0's first step -- goal: ddlkit within 1.2x; Ray Train's ``TorchTrainer`` running the
  same model and loop with 2 workers (from ``trainer.fit()``, the driver already connected: needs
  ``pip install 'ray[train]==<Ray's version>'``); the same ddlkit job on ``compute=local_mpi``
  (2 simulated nodes, mpirun on this machine). Ratios ddlkit / each. ddlkit's job does the
  baselines' work in the timed steps: the ``--steps`` steps are one epoch, without validation (no
  epoch-end checkpoint or validation among them). A first round on the fresh cluster is run and not
  counted (with ``--rounds`` > 1): a cluster just started keeps the cores busy for a while;
* **(b) node killed -> first step after recovery**: a 3-node cluster, the job on 2 nodes with a
  checkpoint every ``--checkpoint-every`` steps; at step 20 a node of the job that is not the head is
  killed (its raylet, SIGKILL); measured: from the kill to the first step of the restarted run (rank
  0's, from the last run's ``result.json``; its console line too) and to the job's end (ddlkit's
  restart policy, ``restart.backoff_s=0``: the driver places the gang again, in place, on the
  cluster's third node). Baseline:
  ``TorchTrainer`` with ``FailureConfig(max_failures=1)``, checkpointing (``ray.train.report``) every
  ``--checkpoint-every`` steps and resuming from ``ray.train.get_checkpoint()``, a node of one of its
  workers killed the same way at its step 20: from the kill to the restarted workers' first step;
  ``--rounds`` rounds, the two sides in turn, each on a fresh cluster; the ratio of the medians;
* **(c) a 4-job sweep**: ``ddlkit -m ... compute=ray`` of 4 short fake trainings (one CPU each, the
  cluster has ``--cpus-per-node`` x 2) vs the same 4 jobs run as plain ``ray.remote`` tasks (each
  runs the ddlkit job with ``compute=local`` on a node of the cluster); ratio = ray / tasks;
* **(d) requests to the Ray dashboard per job-minute while following**: a counting HTTP reverse
  proxy on 127.0.0.1 (``ddlkit_ray.testing.CountingProxy``) in front of the dashboard,
  ``compute.address`` pointed at it, the default ``compute.poll_interval_s``; a 2-rank fake training
  that lasts ``--follow-s`` seconds, followed to its end by the real ``ddlkit`` command: every
  request from the job's submission to the launcher's exit (job status, the log stream -- one
  websocket -- or log reads, the node list, the files fetched at the end), per minute of that time,
  and by kind -- goal: <= 30.

    pip install 'ray[train]==2.60.0'       # Ray Train, for the TorchTrainer baselines (Ray's own version)
    python benchmarks/ray_target.py [--steps 60 --rounds 3 --cpus-per-node 2 --follow-s 120] [--skip a,b,c,d] [--quick]

``--quick`` runs each part once, small: the fake framework for ddlkit's jobs and a tiny net for the
hand-written and Ray Train baselines (a check that the script runs, not figures). Writes
benchmarks/results/ray.json (``ray-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import RESULTS, summary, write_result
from _ray_plain_job import build_model  # the baselines' model, ResNet-18 as ddlkit's or a tiny net

from ddlkit_ray.testing import CountingProxy, LocalRayCluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

FIRST_STEP = "first step done"
PLAIN_JOB = HERE / "_ray_plain_job.py"


def env() -> dict[str, str]:
    return {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes", "RAY_USAGE_STATS_ENABLED": "0"}


def job_overrides(args: argparse.Namespace) -> list[str]:
    """ddlkit's 2-rank job: the work the baselines do -- ``--steps`` steps in one epoch, so no
    validation and no epoch-end checkpoint in the timed steps (the baselines have neither), on one
    synthetic batch per rank (``data.pool_mib=1``: the baselines train on one batch, made once)."""
    if args.quick:
        return ["framework=fake", "framework.step_delay_s=0.05", f"trainer.max_steps={args.steps}", "trainer.epochs=10"]
    return [
        "framework=pytorch",
        "model=resnet18",
        "data=synthetic",
        f"data.image_size={args.image_size}",
        "data.num_classes=10",
        f"data.length={args.batch * 2 * args.steps}",
        "data.pool_mib=1",
        f"trainer.batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        "trainer.epochs=1",
        "trainer.validate=false",
        "framework.num_threads=1",
    ]


def model_name(args: argparse.Namespace) -> str:
    """The baselines' model: ResNet-18 as ddlkit's job, or a tiny net with --quick (ddlkit trains the fake)."""
    return "tiny" if args.quick else "resnet18"


class Launcher:
    """A command in a subprocess (``ddlkit`` by default), its console read line by line with the time
    each line came; ``t0``/``wall0``: when it started, on the monotonic and the Unix clock."""

    def __init__(self, argv: list[str], cwd: Path, *, command: list[str] | None = None) -> None:
        self.lines: list[tuple[float, str]] = []
        self.t0, self.wall0 = time.monotonic(), time.time()
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "ddlkit"]), *argv],
            cwd=cwd,
            env=env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
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
        raise RuntimeError(f"no {text!r} on the console: {self.output()[-3000:]}")

    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def finish(self, timeout: float = 1800) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code


def first_step_at(job_dir: Path) -> float:
    """The Unix time of rank 0's first step in the job's last run (``result.json``'s ``startup_s``)."""
    startup = json.loads((job_dir / "result.json").read_text())["startup_s"]
    return startup["started_at"] + startup[FIRST_STEP]


def ddlkit_job(args: argparse.Namespace, base: Path, name: str, compute: list[str]) -> dict[str, Any]:
    job_dir = base / name
    run = Launcher([*job_overrides(args), "dist=native", *compute, f"hydra.run.dir={job_dir}"], base)
    on_console = run.when(FIRST_STEP) - run.t0
    code = run.finish()
    if code != 0:
        raise RuntimeError(f"{name} exited {code}: {run.output()[-3000:]}")
    result = json.loads((job_dir / "result.json").read_text())
    return {
        "submit_to_first_step_s": first_step_at(job_dir) - run.wall0,
        "submit_to_first_step_on_console_s": on_console,
        "images_per_sec": result["images_per_sec"],
    }


def plain_job(cluster: LocalRayCluster, args: argparse.Namespace, base: Path, name: str) -> dict[str, Any]:
    """The hand-written Ray job (``_ray_plain_job.py``), submitted with the real ``ray job submit``,
    which uploads its working directory and follows the job's log to its end."""
    work, marks = base / name, base / f"{name}-marks"
    work.mkdir()
    marks.mkdir()
    shutil.copy(PLAIN_JOB, work / PLAIN_JOB.name)
    run = Launcher(
        [
            "job",
            "submit",
            f"--address={cluster.address}",
            f"--working-dir={work}",
            "--",
            "python",
            PLAIN_JOB.name,
            "--ranks=2",
            f"--model={model_name(args)}",
            f"--batch={args.batch}",
            f"--image-size={args.image_size}",
            f"--steps={args.steps}",
            f"--marks={marks}",
        ],
        base,
        command=[sys.executable, "-m", "ray.scripts.scripts"],
    )
    on_console = run.when(FIRST_STEP) - run.t0
    code = run.finish()
    if code != 0:
        raise RuntimeError(f"ray job submit exited {code}: {run.output()[-3000:]}")
    first = float((marks / "first-steps").read_text().split()[0])
    out = {"submit_to_first_step_s": first - run.wall0, "submit_to_first_step_on_console_s": on_console}
    if (marks / "rate").exists():
        out["images_per_sec"] = float((marks / "rate").read_text())
    return out


# ---------------------------------------------------------------------------- Ray Train baselines
def _train_loop(config: dict[str, Any]) -> None:
    """Ray Train's worker: the model and loop ddlkit's PyTorch job runs (SGD with momentum, DDP
    through Ray Train, synthetic batches), timing steps after the warm-up; with ``checkpoint_every``,
    a checkpoint reported every that many steps and the loop resumed from Ray Train's latest."""
    import tempfile as _tempfile

    import ray
    import ray.train
    import ray.train.torch
    import torch

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    marks = Path(config["marks"])
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(build_model(config["model"], 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(Path(d) / "state.pt")
        getattr(model, "module", model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        if rank == 0:
            (marks / "resumed-from").write_text(str(start))
    torch.manual_seed(rank)
    x = torch.randn(config["batch"], 3, config["image_size"], config["image_size"])
    y = torch.randint(0, 10, (config["batch"],))
    (marks / f"node-{rank}").write_text(ray.get_runtime_context().get_node_id())
    warmup, t_start, every = 5, None, config.get("checkpoint_every")
    for step in range(start + 1, config["steps"] + 1):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if step == start + 1 and rank == 0:
            with open(marks / "first-steps", "a") as f:
                f.write(f"{time.time()}\n")
        if step == 20 and rank == 0:
            (marks / "step-20").touch()
        if step == start + warmup:
            t_start = time.perf_counter()
        if config.get("step_delay_s"):
            time.sleep(config["step_delay_s"])
        if every and step % every == 0:
            with _tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save(
                        {"model": getattr(model, "module", model).state_dict(), "opt": opt.state_dict(), "step": step},
                        Path(d) / "state.pt",
                    )
                ray.train.report(
                    {"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d) if rank == 0 else None
                )
    if rank == 0 and t_start is not None and config["steps"] > start + warmup:
        rate = (
            (config["steps"] - start - warmup)
            * config["batch"]
            * ctx.get_world_size()
            / (time.perf_counter() - t_start)
        )
        (marks / "rate").write_text(str(rate))


def ray_train(cluster: LocalRayCluster, args: argparse.Namespace, *, kill: bool = False) -> dict[str, Any]:
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError as exc:
        return {"skipped": f"Ray Train is not installed ({exc}): pip install 'ray[train]=={_ray_version()}'"}
    import _ray_plain_job

    # the workers cannot import this directory (its ray.py would shadow Ray): build_model travels by value
    ray.cloudpickle.register_pickle_by_value(_ray_plain_job)
    marks = Path(tempfile.mkdtemp(prefix="ray-train-"))
    ray.init(
        address=cluster.gcs_address,
        ignore_reinit_error=True,
        logging_level="WARNING",
        runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}},
    )
    config = {
        "batch": args.batch,
        "image_size": args.image_size,
        "steps": args.steps,
        "marks": str(marks),
        "model": model_name(args),
        "step_delay_s": 0.05 if args.quick else 0.0,
        "checkpoint_every": args.checkpoint_every if kill else None,
    }
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1}, placement_strategy="STRICT_SPREAD"
        ),
        run_config=RunConfig(
            storage_path=str(marks / "storage"),
            name="bench",
            failure_config=FailureConfig(max_failures=1 if kill else 0),
        ),
    )
    out: dict[str, Any] = {}
    if kill:

        def killer() -> None:
            while not all((marks / f).exists() for f in ("node-0", "node-1", "step-20")):
                time.sleep(0.02)
            head = cluster.head_node_id()
            nodes = [(marks / f"node-{r}").read_text().strip() for r in (1, 0)]
            out["killed_at"] = time.time()
            cluster.kill_node(next(n for n in nodes if n != head))  # a worker's node, not the head

        threading.Thread(target=killer, daemon=True).start()
    t0 = time.time()
    trainer.fit()
    end = time.time()
    firsts = [float(x) for x in (marks / "first-steps").read_text().split()]
    out["submit_to_first_step_s"] = firsts[0] - t0
    if (marks / "rate").exists():
        out["images_per_sec"] = float((marks / "rate").read_text())
    if kill and "killed_at" in out:
        if len(firsts) > 1:
            out["kill_to_first_step_s"] = firsts[-1] - out["killed_at"]
        out["kill_to_end_s"] = end - out["killed_at"]
        if (marks / "resumed-from").exists():
            out["resumed_from_step"] = int((marks / "resumed-from").read_text())
    ray.shutdown()
    shutil.rmtree(marks, ignore_errors=True)
    return out


def _ray_version() -> str:
    import ray

    return ray.__version__


# ---------------------------------------------------------------------------- the parts
def part_a(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with LocalRayCluster(nodes=2, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
        # a cluster just started keeps its cores busy for a while (the dashboard, its agents, the
        # first workers): a round on it first, not counted, so that no side runs on a cold cluster
        for r in range(-1 if args.rounds > 1 else 0, args.rounds):
            # interleaved, in a different order each round: a slow spell of the machine hits all sides
            runs = {
                "ray": lambda r=r: ddlkit_job(
                    args,
                    base,
                    f"a-ray-{r}",
                    [
                        "compute=ray",
                        f"compute.address={cluster.address}",
                        "compute.nodes=2",
                        "compute.poll_interval_s=0.5",
                    ],
                ),
                "plain_ray_job": lambda r=r: plain_job(cluster, args, base, f"a-plain-{r}"),
                "local_mpi": lambda r=r: ddlkit_job(args, base, f"a-mpi-{r}", ["compute=local_mpi", "compute.nodes=2"]),
                "ray_train": lambda: ray_train(cluster, args),
            }
            order = list(runs)[r % len(runs) :] + list(runs)[: r % len(runs)]
            done = {who: runs[who]() for who in order}
            if r < 0:
                print(f"(a) warm-up round, not counted: {json.dumps(done)}", flush=True)
                continue
            rounds.append(done)
            print(f"(a) round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    out: dict[str, Any] = {"rounds": rounds}
    for who in ("ray", "plain_ray_job", "local_mpi", "ray_train"):
        for key in ("submit_to_first_step_s", "submit_to_first_step_on_console_s", "images_per_sec"):
            if any(key in x[who] for x in rounds):
                out[f"{who}_{key}"] = summary([x[who][key] for x in rounds if key in x[who]])
    for other in ("plain_ray_job", "local_mpi", "ray_train"):
        for key, ratio in (("submit_to_first_step_s", "first_step"), ("images_per_sec", "ips")):
            if f"{other}_{key}" in out and f"ray_{key}" in out:
                out[f"{ratio}_ratio_ray_over_{other}"] = out[f"ray_{key}"]["median"] / out[f"{other}_{key}"]["median"]
    out["goal"] = "first_step_ratio_ray_over_plain_ray_job <= 1.2"
    return out


def part_b(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        rounds.append({"ddlkit": recovery_ddlkit(args, base / f"b-ray-{r}")})
        print(f"(b) round {r + 1} ddlkit: {json.dumps(rounds[-1]['ddlkit'])}", flush=True)
        with LocalRayCluster(nodes=3, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
            rounds[-1]["ray_train"] = ray_train(cluster, args, kill=True)
        print(f"(b) round {r + 1} Ray Train: {json.dumps(rounds[-1]['ray_train'])}", flush=True)
    out: dict[str, Any] = {"rounds": rounds}
    for who in ("ddlkit", "ray_train"):
        if times := [x[who]["kill_to_first_step_s"] for x in rounds if "kill_to_first_step_s" in x[who]]:
            out[f"{who}_kill_to_first_step_s"] = summary(times)
    if "ddlkit_kill_to_first_step_s" in out and "ray_train_kill_to_first_step_s" in out:
        out["recovery_ratio_ddlkit_over_ray_train"] = (
            out["ddlkit_kill_to_first_step_s"]["median"] / out["ray_train_kill_to_first_step_s"]["median"]
        )
    out["goal"] = "recovery_ratio_ddlkit_over_ray_train <= 1.0"
    return out


def recovery_ddlkit(args: argparse.Namespace, job_dir: Path) -> dict[str, Any]:
    """ddlkit's job on 2 of a 3-node cluster, a node of it killed at step 20: the restart policy
    restarts it on the nodes left (``restart.backoff_s=0``)."""
    with LocalRayCluster(nodes=3, cpus_per_node=args.cpus_per_node, env=env()) as cluster:
        run = Launcher(
            [
                *job_overrides(args),
                "dist=native",
                "dist.timeout_s=30",
                "compute=ray",
                f"compute.address={cluster.address}",
                "compute.nodes=2",
                "compute.poll_interval_s=0.5",
                "compute.sync_interval_s=2",
                f"trainer.checkpoint_every={args.checkpoint_every}",
                "trainer.log_every=5",
                "restart.backoff_s=0",
                f"hydra.run.dir={job_dir}",
            ],
            job_dir.parent,
        )
        started = run.when("started on node(s)")
        text = next(line for t, line in run.lines if t == started)
        found = re.search(r"0 \((\w+)\), 1 \((\w+)\)", text)
        assert found, text
        # a node of the job that is not the head (whose loss ends the cluster)
        node = next(n for n in (found[2], found[1]) if not cluster.head_node_id().startswith(n))
        run.when("step 20/")
        killed, killed_wall = time.monotonic(), time.time()
        cluster.kill_node(node)
        resumed = run.when(FIRST_STEP, after=killed)
        code = run.finish()
        if code != 0:
            raise RuntimeError(f"(b) ddlkit exited {code}: {run.output()[-3000:]}")
        result = json.loads((job_dir / "result.json").read_text())
        return {
            "kill_to_first_step_s": first_step_at(job_dir) - killed_wall,
            "kill_to_first_step_on_console_s": resumed - killed,
            "kill_to_end_s": time.monotonic() - killed,
            "restarts": result.get("restarts"),
            "resumed_from_step": result.get("resumed_from_step"),
            "steps_lost": result.get("steps_lost"),
        }


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
            run = Launcher(
                [
                    "-m",
                    *fake,
                    "compute=ray",
                    f"compute.address={cluster.address}",
                    "compute.poll_interval_s=0.5",
                    f"optimizer.lr={','.join(lrs)}",
                    f"sweep.max_parallel={len(lrs)}",
                    f"hydra.sweep.dir={sweep_dir}",
                ],
                base,
            )
            if run.finish() != 0:
                raise RuntimeError(run.output()[-3000:])
            ddlkit_s = time.monotonic() - t0
            ray.init(address=cluster.gcs_address, ignore_reinit_error=True, logging_level="WARNING")
            task = ray.remote(num_cpus=1)(_task)
            t0 = time.monotonic()
            codes = ray.get(
                [
                    task.remote([*fake, f"optimizer.lr={lr}", f"hydra.run.dir={base}/c-task-{r}-{i}"], str(base))
                    for i, lr in enumerate(lrs)
                ]
            )
            tasks_s = time.monotonic() - t0
            ray.shutdown()
            assert codes == [0] * len(lrs), codes
            rounds.append({"ddlkit_sweep_s": ddlkit_s, "ray_tasks_s": tasks_s})
            print(f"(c) round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    d, t = summary([x["ddlkit_sweep_s"] for x in rounds]), summary([x["ray_tasks_s"] for x in rounds])
    return {
        "rounds": rounds,
        "ddlkit_sweep_s": d,
        "ray_tasks_s": t,
        "ratio_ddlkit_over_tasks": d["median"] / t["median"],
    }


def request_kind(method: str, path: str) -> str:
    """What a request to the dashboard is for."""
    path = path.split("?")[0].rstrip("/")
    if path.startswith("/api/jobs"):
        if method == "POST" and path == "/api/jobs":
            return "submit"
        if path.endswith("/logs/tail"):
            return "job log stream"  # one websocket, open while the job runs
        return "job logs" if path.endswith("/logs") else f"job {method}"
    for prefix, kind in (
        ("/api/v0/logs", "files (log API)"),
        ("/api/v0/", "state API"),
        ("/api/packages", "upload"),
        ("/api/version", "version"),
    ):
        if path.startswith(prefix):
            return kind
    return "other"


def part_d(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    delay = 0.25
    steps = max(4, int(args.follow_s / delay))
    rounds = []
    with (
        LocalRayCluster(nodes=2, cpus_per_node=args.cpus_per_node, env=env()) as cluster,
        CountingProxy(cluster.address) as proxy,
    ):
        for r in range(args.rounds):
            job_dir = base / f"d-ray-{r}"
            run = Launcher(
                [
                    "framework=fake",
                    f"framework.step_delay_s={delay}",
                    f"trainer.max_steps={steps}",
                    "trainer.epochs=1000",
                    "dist=native",
                    "compute=ray",
                    f"compute.address={proxy.address}",
                    "compute.nodes=2",
                    f"hydra.run.dir={job_dir}",
                ],
                base,
            )
            code = run.finish()
            end = time.time()
            if code != 0:
                raise RuntimeError(f"(d) ddlkit exited {code}: {run.output()[-3000:]}")
            seen = proxy.between(run.wall0, end)
            submitted = next(t for t, method, path in seen if request_kind(method, path) == "submit")
            following = [(m, p) for t, m, p in seen if t >= submitted]
            minutes = (end - submitted) / 60
            rounds.append(
                {
                    "followed_s": end - submitted,
                    "requests": len(following),
                    "requests_per_job_minute": len(following) / minutes,
                    "by_kind_per_job_minute": {
                        k: n / minutes for k, n in Counter(request_kind(m, p) for m, p in following).items()
                    },
                    "before_submission": len(seen) - len(following),
                }
            )
            print(f"(d) round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    return {
        "rounds": rounds,
        "poll_interval_s": "the default (compute.poll_interval_s)",
        "requests_per_job_minute": summary([x["requests_per_job_minute"] for x in rounds]),
        "goal": "requests_per_job_minute <= 30",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--cpus-per-node", type=int, default=2)
    parser.add_argument("--follow-s", type=float, default=120.0, help="(d): how long the followed job trains")
    parser.add_argument("--skip", default="", help="parts to leave out: a,b,c,d")
    parser.add_argument(
        "--quick", action="store_true", help="each part once, small (the fake framework, a tiny net): checks the script"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.follow_s = 1, 10.0
    skip = set(filter(None, args.skip.split(",")))
    base = Path(tempfile.mkdtemp(prefix="ddlkit-bench-ray-"))
    out: dict[str, Any] = {"args": vars(args), "ray": _ray_version()}
    # the parts left out keep the figures of the run before (each says when it was taken)
    earlier = RESULTS / "ray.json"
    kept = json.loads(earlier.read_text()) if skip and not args.quick and earlier.is_file() else {}
    for name, part in (("a", part_a), ("b", part_b), ("c", part_c), ("d", part_d)):
        if name not in skip:
            out[name] = {**part(args, base), "taken": time.strftime("%Y-%m-%d")}
        elif name in kept:
            out[name] = kept[name]
    path = write_result("ray" + ("-quick" if args.quick else ""), out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
