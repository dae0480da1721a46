"""Restart and resume after a lost node: ddlkit against torchrun's elastic agent.

ddlkit's restart policy (``compute=local_mpi``) and torchrun's agent, on the same model, data and machine.

Both sides train ResNet-18 (``ddlkit_pytorch.models``) on ddlkit's synthetic images with the same
per-rank batch, one thread per rank, deterministic on the CPU, a checkpoint every C steps, on 2
simulated nodes of 1 rank (2x1) and of 2 ranks (2x2):

* ddlkit: ``ddlkit framework=pytorch compute=local_mpi compute.nodes=2 dist=native
  trainer.checkpoint_every=C restart.backoff_s=B`` (B: ``--backoff-s``, 0 by default: torchrun's
  agent restarts at once; ddlkit's default, 10 s, adds 10 s to T_resume);
* torchrun: one elastic agent per simulated node, ``python -m torch.distributed.run --nnodes=1:2
  --nproc-per-node=P --max-restarts=N --rdzv-backend=c10d`` on a localhost rendezvous (node 0's agent
  hosts it), each running the hand-written DDP loop ``benchmarks/_torchrun_train.py`` (torch.save
  every C steps, resume from the newest).

Scenarios, each at step s (``--kill-at``) of a run of s + ``--after`` steps:

* ``kill``: SIGKILL to every rank of node 1 (its workers; ddlkit's launcher and torchrun's agents
  live on). Both restart on the same world size.
* ``notice``: SIGTERM to every rank of node 1 (a preemption notice): ddlkit's ranks agree on a step
  and checkpoint before they leave; the hand-written loop has no handler, as usual, and dies.
* ``shrink``: node 1 is lost for good. torchrun: its agent and workers SIGKILLed; node 0's agent goes
  on alone after the rendezvous' last call (``--nnodes=1:2``). ddlkit: only where ``compute.min_nodes``
  exists (elastic world size), run with ``compute.min_nodes=1``, node 1 marked down (its scratch
  directory holds ``down``) and its ranks SIGKILLed; skipped with a note where the option is missing.
* ``goodput``: a failure schedule, node 1's ranks SIGKILLed every ``--period`` seconds for
  ``--duration`` seconds from the launch (a failure due while the job is still down from the last
  one hits node 1's ranks as soon as they are back); useful steps (the step counter at the end: steps
  lost to a failure and trained again count once) / wall time, as a ratio to a failure-free run;
  ``--rounds`` failing runs a side (the sides take turns), one failure-free run a side.

Observed the same way on both sides: rank 0 writes one JSON line per optimizer step with the wall
clock (ddlkit's ``logger=jsonl``, the loop's own ``metrics.jsonl`` in the same format), which this
script reads while the job runs; the kill's time is taken just before the signal.

* T_detect: kill -> every survivor rank's worker process has left (gone from /proc or a zombie,
  polled every 5 ms): each one left its collective, by an error or killed by its launcher/agent.
* T_resume: kill -> the first optimizer step completed after the restart (its line's time).
* steps lost: the last step completed before the restart - the step it resumed from.
* fidelity: the loss at step s + ``--after`` against a run of the same world size that never
  failed: bitwise equal or not, and the difference.

    python benchmarks/faults.py [--rounds 3] [--worlds 2x1,2x2] [--quick]

Writes benchmarks/results/faults.json and faults.png (steps vs wall time of the goodput runs, the
failures marked: the median round; ``--replot`` redraws it). The full run takes about 30 minutes on
an idle 2-core machine; ``--quick`` (one round, 2x1 only, an 80 s schedule with one failure) about 6, and 15 on a
busy one. ``--keep DIR`` keeps every job's directory and logs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import RESULTS, one_thread_env, rank_workers, summary, write_result

HERE = Path(__file__).resolve().parent
TRAIN_SCRIPT = HERE / "_torchrun_train.py"
SIDES = ("ddlkit", "torchrun")
SCENARIOS = ("kill", "notice", "shrink", "goodput")
GOALS = {
    "t_detect_s": 5.0,
    "t_resume_s": 30.0,
    "steps_lost": "<= checkpoint_every",
    "fidelity": "bitwise",
    "goodput_vs_torchrun": 1.0,
}
#: how often the harness looks at the job (its metrics file, its processes)
POLL_S = 0.02
#: the longest any one run may take before the benchmark gives up on it
RUN_TIMEOUT_S = 600.0
#: seconds torchrun's agents get to leave after the last step (see Run.wait)
AGENT_EXIT_S = 15.0
#: torchrun's agents share their rendezvous store with the workers' process group by default, and
#: each agent counts its restarts on its own: after a restart the workers can read a peer's address
#: from the attempt before and fail or hang in init_process_group (pytorch/pytorch#135712; seen here
#: with torch 2.13). The workaround its maintainers give: a store of the workers' own.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Shape:
    nodes: int
    procs_per_node: int
    batch: int
    image_size: int
    num_classes: int
    checkpoint_every: int
    pool_mib: int = 16

    @property
    def world(self) -> str:
        return f"{self.nodes}x{self.procs_per_node}"


def elastic_option() -> str | None:
    """Why ddlkit's shrink rows cannot run here (no ``compute.min_nodes`` on local_mpi), or None."""
    import dataclasses

    from ddlkit_mpi.target import LocalMpiConfig

    if "min_nodes" not in {f.name for f in dataclasses.fields(LocalMpiConfig)}:
        return (
            "compute=local_mpi has no compute.min_nodes (elastic world size) in this checkout: a job that lost "
            "a node restarts on all of its nodes"
        )
    return None


# ---------------------------------------------------------------------------- processes
def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie has: it waits only for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def children(pid: int) -> list[int]:
    from ddlkit.compute.process import processes

    return [p for p, ppid, _ in processes() if ppid == pid]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def read_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(line))
    return lines


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"torchrun's rendezvous on port {port} did not open within {timeout:g} s")


# ---------------------------------------------------------------------------- one job of either side
@dataclass
class Run:
    """One training job, watched: every metrics line ever seen (ddlkit's jsonl logger drops the lines
    past the checkpoint it resumes from; the timeline keeps them), and the kills sent to it."""

    side: str
    shape: Shape
    steps: int
    job_dir: Path
    elastic: bool = False
    t_launch: float = 0.0
    timeline: dict[tuple[int, float], float] = field(default_factory=dict)  # (step, time) -> loss
    kills: list[float] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    #: torchrun agents killed with their node (their exit status is the kill's)
    lost_agents: set[int] = field(default_factory=set)
    #: what happened that the figures do not show
    notes: list[str] = field(default_factory=list)

    @property
    def metrics_path(self) -> Path:
        return self.job_dir / "metrics.jsonl"

    # -------------------------------------------------------------- start
    def start(self, *, max_restarts: int, backoff_s: float) -> None:
        self.job_dir.mkdir(parents=True)
        self.t_launch = time.time()
        if self.side == "ddlkit":
            self._start_ddlkit(max_restarts, backoff_s)
        else:
            self._start_torchrun(max_restarts)

    def _start_ddlkit(self, max_restarts: int, backoff_s: float) -> None:
        s = self.shape
        args = [
            "framework=pytorch",
            "framework.num_threads=1",
            "model=resnet18",
            f"data.image_size={s.image_size}",
            f"data.num_classes={s.num_classes}",
            f"data.length={s.batch * s.nodes * s.procs_per_node * self.steps}",
            f"data.pool_mib={s.pool_mib}",
            "optimizer.warmup_epochs=0",
            f"trainer.batch_size={s.batch}",
            "trainer.epochs=1",
            "trainer.validate=false",
            "trainer.save_model=false",
            "trainer.log_every=1",
            f"trainer.checkpoint_every={s.checkpoint_every}",
            "trainer.deterministic=true",
            "logger=[console,jsonl]",
            "compute=local_mpi",
            f"compute.nodes={s.nodes}",
            f"compute.procs_per_node={s.procs_per_node}",
            "dist=native",
            f"restart.max_restarts={max_restarts}",
            f"restart.backoff_s={backoff_s:g}",
        ]
        if self.elastic:
            args.append("compute.min_nodes=1")
        with open(self.job_dir.parent / f"{self.job_dir.name}.launcher.log", "w") as log:  # the child keeps it
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ddlkit", *args, f"hydra.run.dir={self.job_dir}"],
                    cwd=self.job_dir.parent,
                    env=one_thread_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _start_torchrun(self, max_restarts: int) -> None:
        from ddlkit_mpi.target import free_ports

        s = self.shape
        (port,) = free_ports(1)
        for node in range(s.nodes):
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes=1:{s.nodes}",
                f"--nproc-per-node={s.procs_per_node}",
                f"--max-restarts={max_restarts}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={self.job_dir.name}",
                # node 0's agent hosts the rendezvous store, so that losing node 1 does not lose it
                f"--rdzv-conf=is_host={int(node == 0)}",
                str(TRAIN_SCRIPT),
                "--out",
                str(self.job_dir),
                "--steps",
                str(self.steps),
                "--checkpoint-every",
                str(s.checkpoint_every),
                "--batch",
                str(s.batch),
                "--image-size",
                str(s.image_size),
                "--num-classes",
                str(s.num_classes),
                "--pool-mib",
                str(s.pool_mib),
            ]
            with open(self.job_dir / f"agent-{node}.log", "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        command,
                        cwd=self.job_dir,
                        env={**one_thread_env(), **TORCHRUN_ENV},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            if node == 0:
                wait_port(port, 60)

    # -------------------------------------------------------------- what it does
    def poll(self) -> list[dict[str, Any]]:
        lines = read_lines(self.metrics_path)
        for line in lines:
            if line.get("split") == "train" and "step" in line:
                self.timeline.setdefault((line["step"], line["time"]), line["loss"])
        return lines

    def step(self) -> int:
        """The newest step rank 0 logged."""
        lines = [ln for ln in self.poll() if ln.get("split") == "train"]
        return max((ln["time"], ln["step"]) for ln in lines)[1] if lines else 0

    def node_workers(self, node: int) -> list[int]:
        if self.side == "ddlkit":
            return [
                pid for pid, environ in rank_workers(self.job_dir).items() if environ.get("DDLKIT_NODE") == str(node)
            ]
        if node >= len(self.procs) or self.procs[node].poll() is not None:
            return []
        return [p for p in children(self.procs[node].pid) if not gone(p)]

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def restarts(self) -> list[dict[str, Any]]:
        """Each restart: when it was decided or began, and the step it resumed from."""
        if self.side == "ddlkit":
            with contextlib.suppress(OSError, ValueError):
                record = json.loads((self.job_dir / ".ddlkit" / "submission.json").read_text())
                # "time": when the launcher submits the job again
                return [
                    {"time": r["time"], "relaunched": r["time"], "resumed_from": r["resumed_from"]}
                    for r in record.get("restarts", [])
                ]
            return []
        starts = [ln for ln in read_lines(self.metrics_path) if ln.get("event") == "start"]
        # "launched": when the agent started the new worker (after the rendezvous)
        return [
            {
                "time": ln["time"],
                "relaunched": ln["launched"],
                "resumed_from": ln["resumed_from"],
                "world_size": ln["world_size"],
            }
            for ln in starts[1:]
        ]

    def world_size_now(self) -> int | None:
        if self.side == "ddlkit":
            with contextlib.suppress(OSError, ValueError):
                return json.loads((self.job_dir / "result.json").read_text()).get("world_size")
            return None
        starts = [ln for ln in read_lines(self.metrics_path) if ln.get("event") == "start"]
        return starts[-1]["world_size"] if starts else None

    def launcher_lines(self) -> list[str]:
        """ddlkit's restart lines, as its console printed them."""
        if self.side != "ddlkit":
            return []
        log = self.job_dir.parent / f"{self.job_dir.name}.launcher.log"
        return [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("ddlkit: restart")]

    # -------------------------------------------------------------- faults
    def hit(self, how: str) -> tuple[float, list[int]]:
        """Send the fault ``how`` to node 1; return the time it was sent and node 0's workers then."""
        victims = self.node_workers(1)
        survivors = self.node_workers(0)
        if not victims:
            raise RuntimeError(f"{self.side}: node 1 has no rank to {how} in {self.job_dir}")
        if how == "shrink" and self.side == "ddlkit":
            from ddlkit_mpi import target

            down = self.job_dir / "nodes" / "node-1" / getattr(target, "NODE_DOWN", "down")
            down.parent.mkdir(parents=True, exist_ok=True)
            down.write_text("lost\n")
        t = time.time()
        if how == "shrink" and self.side == "torchrun":
            os.kill(self.procs[1].pid, signal.SIGKILL)  # the node's agent first: it may not react
            self.lost_agents.add(1)
        signal_all(victims, signal.SIGTERM if how == "notice" else signal.SIGKILL)
        self.kills.append(t)
        return t, survivors

    # -------------------------------------------------------------- end
    def wait(self, timeout: float = RUN_TIMEOUT_S) -> None:
        """Until the job has ended. torchrun's job is over at its last step: its agents then wait for
        each other at an exit barrier (300 s when one lost its store connection, as happens here), and a
        worker may hang in gloo's teardown; they get :data:`AGENT_EXIT_S` to leave."""
        deadline = time.monotonic() + timeout
        trained_at = None
        while self.running():
            self.poll()
            if self.side == "torchrun" and trained_at is None and self.step() >= self.steps:
                trained_at = time.monotonic()
            if trained_at is not None and time.monotonic() - trained_at > AGENT_EXIT_S:
                self.notes.append(
                    f"torchrun's agents or workers were still there {AGENT_EXIT_S:g} s after the last step; stopped"
                )
                self.stop()
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.side} job in {self.job_dir} ran past {timeout:g} s; stopped")
            time.sleep(0.1)
        self.poll()
        codes = [p.returncode for p in self.procs]
        if self.side == "torchrun":
            if self.step() < self.steps:
                raise RuntimeError(f"torchrun job in {self.job_dir} failed (agents' exit {codes}); see agent-*.log")
            if any(c != 0 for i, c in enumerate(codes) if i not in self.lost_agents) and not self.notes:
                self.notes.append(f"torchrun's agents exited {codes} after the last step")
        elif codes != [0]:
            raise RuntimeError(f"ddlkit job in {self.job_dir} failed (exit {codes[0]}); see its .launcher.log")

    def stop(self) -> None:
        """End the job now (ddlkit: as a Ctrl-C does, then by force)."""
        if self.side == "ddlkit" and self.procs and self.procs[0].poll() is None:
            self.procs[0].send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.procs[0].wait(60)
        # torchrun starts each worker in a session of its own: they go first, then the agents
        workers = [w for n in range(len(self.procs)) for w in self.node_workers(n)] if self.side == "torchrun" else []
        signal_all(workers, signal.SIGKILL)
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.poll()


# ---------------------------------------------------------------------------- measurements
def wait_for_step(run: Run, step: int, timeout: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while run.step() < step:
        if not run.running() or time.monotonic() > deadline:
            run.stop()
            raise RuntimeError(f"{run.side} job in {run.job_dir} never reached step {step}; see its logs")
        time.sleep(POLL_S)


def detect_time(run: Run, t_kill: float, survivors: list[int], timeout: float = 120.0) -> float | None:
    """Seconds from the kill until every survivor's worker has ended (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    left = list(survivors)
    last = 0.0
    polls = 0
    while left and time.monotonic() < deadline:
        left = [p for p in left if not gone(p)]
        last = time.time()
        polls += 1
        if polls % 4 == 0:
            run.poll()  # lines written just after the kill, before ddlkit's logger drops them on resume
        if left:
            time.sleep(0.005)
    return None if left else round(last - t_kill, 3)


def loss_at(run: Run, step: int) -> float | None:
    """The loss of ``step`` as the finished job logged it last (the run that counted)."""
    lines = [ln for ln in read_lines(run.metrics_path) if ln.get("split") == "train" and ln.get("step") == step]
    return lines[-1]["loss"] if lines else None


def after_restart(run: Run, t_kill: float) -> dict[str, Any]:
    """What the restart after the kill at ``t_kill`` did: resumed from which step, its first step's time."""
    restart = next((r for r in run.restarts() if r["time"] >= t_kill - 1), None)
    if restart is None:
        return {"error": f"no restart after the kill; see {run.job_dir}"}
    resumed = restart["resumed_from"]
    first = min((t for (s, t) in run.timeline if s == resumed + 1 and t > t_kill), default=None)
    if first is None:
        return {"error": f"no step after the restart; see {run.job_dir}", "resumed_from": resumed}
    reached = max(s for (s, t) in run.timeline if t < first)
    return {
        "resumed_from": resumed,
        "step_reached": reached,
        "steps_lost": reached - resumed,
        "t_relaunch_s": round(restart["relaunched"] - t_kill, 3),
        "t_resume_s": round(first - t_kill, 3),
    }


def fault_round(
    side: str,
    how: str,
    shape: Shape,
    work: Path,
    *,
    kill_at: int,
    after: int,
    backoff_s: float,
    reference: float | None,
) -> dict[str, Any]:
    run = Run(
        side,
        shape,
        kill_at + after,
        work / f"{side}-{how}-{shape.world}-{time.monotonic_ns()}",
        elastic=how == "shrink",
    )
    run.start(max_restarts=3, backoff_s=backoff_s)
    try:
        wait_for_step(run, kill_at)
        t_kill, survivors = run.hit(how)
        t_detect = detect_time(run, t_kill, survivors)
        run.wait()
    except RuntimeError as err:  # recorded; the other rounds still run
        return {"error": str(err)}
    finally:
        run.stop()
    out = {
        "t_detect_s": t_detect,
        **after_restart(run, t_kill),
        "world_size_after": run.world_size_now(),
        "restarts": len(run.restarts()),
    }
    loss = loss_at(run, kill_at + after)
    out.update(
        loss=loss,
        reference_loss=reference,
        bitwise=loss is not None and loss == reference,
        loss_difference=None if loss is None or reference is None else loss - reference,
    )
    if lines := run.launcher_lines():
        out["ddlkit_says"] = lines
    if run.notes:
        out["notes"] = run.notes
    return out


def reference_loss(side: str, shape: Shape, work: Path, *, steps: int, backoff_s: float) -> float | None:
    run = Run(side, shape, steps, work / f"{side}-reference-{shape.world}-{time.monotonic_ns()}")
    run.start(max_restarts=0, backoff_s=backoff_s)
    try:
        run.wait()
    finally:
        run.stop()
    return loss_at(run, steps)


def progress_at(run: Run, t_end: float) -> int:
    """Useful steps at ``t_end``: the step counter then. After a kill with no step since, the job
    is between runs: it will resume from its newest checkpoint (the last multiple of C)."""
    seen = sorted((t, s) for (s, t) in run.timeline if t <= t_end)
    if not seen:
        return 0
    t_last, step = seen[-1]
    if any(t_last < k <= t_end for k in run.kills):
        restart = next((r for r in run.restarts() if r["time"] >= max(run.kills) - 1), None)
        every = run.shape.checkpoint_every
        return restart["resumed_from"] if restart else step // every * every
    return step


def goodput_run(
    side: str, shape: Shape, work: Path, *, duration: float, period: float | None, backoff_s: float
) -> dict[str, Any]:
    """Train for ``duration`` seconds from the launch, node 1's ranks SIGKILLed every ``period``."""
    failing = period is not None
    kind = "failing" if failing else "free"
    run = Run(side, shape, 10**6, work / f"{side}-goodput-{kind}-{shape.world}-{time.monotonic_ns()}")
    run.start(max_restarts=1000, backoff_s=backoff_s)
    t_end = run.t_launch + duration
    due = (
        [run.t_launch + period * k for k in range(1, int(duration // period) + 1) if period * k < duration]
        if failing
        else []
    )
    try:
        while time.time() < t_end:
            if not run.running():
                raise RuntimeError(f"{side} job in {run.job_dir} ended during the schedule; see its logs")
            run.poll()
            if due and time.time() >= due[0] and run.step() > 0 and run.node_workers(1):
                # a failure is due (or overdue: the job was still restarting from the last one)
                with contextlib.suppress(RuntimeError):  # node 1's ranks ended in between: next time
                    run.hit("kill")
                    due.pop(0)
            time.sleep(POLL_S)
        run.poll()
        steps = progress_at(run, t_end)
    finally:
        run.stop()
    return {
        "useful_steps": steps,
        "wall_s": duration,
        "steps_per_s": round(steps / duration, 4),
        "failures": len(run.kills),
        "kills_s": [round(k - run.t_launch, 2) for k in run.kills],
        "timeline": [
            [round(t - run.t_launch, 3), s] for (s, t) in sorted(run.timeline, key=lambda st: st[1]) if t <= t_end
        ],
    }


# ---------------------------------------------------------------------------- the report
def medians(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("t_detect_s", "t_relaunch_s", "t_resume_s", "steps_lost", "resumed_from", "step_reached"):
        values = [s[key] for s in samples if s.get(key) is not None]
        if values:
            out[key] = summary(values)
    out["bitwise"] = [s.get("bitwise") for s in samples]
    out["loss_difference"] = [s.get("loss_difference") for s in samples]
    out["world_size_after"] = [s.get("world_size_after") for s in samples]
    if errors := [s["error"] for s in samples if "error" in s]:
        out["errors"] = errors
    return out


def plot(goodput: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ddlkit": "#4c72b0", "torchrun": "#dd8452"}
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for side, runs in goodput.items():
        for kind, style in (("free", ":"), ("failing", "-")):
            run = runs.get(kind)
            if not run:
                continue
            xs, ys = zip(*run["timeline"], strict=True) if run["timeline"] else ((), ())
            ax.plot(
                xs,
                ys,
                style,
                color=colors[side],
                lw=1.4,
                marker=".",
                markersize=3,
                label=f"{side}, {'no failures' if kind == 'free' else 'node 1 killed'}: "
                f"{run['useful_steps']} useful steps",
            )
            for k in run["kills_s"] if kind == "failing" else ():
                ax.axvline(k, color=colors[side], lw=0.8, alpha=0.5, ls="--")
    ax.set_xlabel("wall time since launch (s); dashed lines: node 1's ranks SIGKILLed")
    ax.set_ylabel("optimizer step")
    ax.set_title(title, fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_result(payload: dict[str, Any]) -> None:
    shape, goodput = payload["shape"], payload["goodput"]
    plot(
        {s: v for s, v in goodput.items() if s in SIDES},
        RESULTS / "faults.png",
        f"useful steps under a failure schedule ({goodput['world']}, ResNet-18 {shape['image_size']}px, batch "
        f"{shape['batch_per_rank']}/rank, checkpoint every {shape['checkpoint_every']} steps, "
        f"{payload.get('machine', {}).get('cpus', os.cpu_count())} CPU cores)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of each fault scenario and of the goodput schedule (medians reported)",
    )
    parser.add_argument("--worlds", default="2x1,2x2", help="simulated nodes x ranks per node")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--checkpoint-every", type=int, default=10, help="C")
    parser.add_argument("--kill-at", type=int, default=25, help="s: the step at which node 1 is hit")
    parser.add_argument("--after", type=int, default=10, help="steps trained after s; the loss at s + this is compared")
    parser.add_argument("--batch", type=int, default=16, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--backoff-s", type=float, default=0.0, help="ddlkit's restart.backoff_s")
    parser.add_argument("--goodput-world", default="2x1")
    parser.add_argument("--duration", type=float, default=90.0, help="goodput: seconds of each run")
    parser.add_argument("--period", type=float, default=30.0, help="goodput: seconds between failures")
    parser.add_argument("--keep", type=Path, help="run the jobs in this directory and keep it (their logs)")
    parser.add_argument(
        "--quick", action="store_true", help="one round, 2x1 only, C=5, s=8, an 80 s schedule with a failure at 40 s"
    )
    parser.add_argument("--replot", action="store_true", help="redraw faults.png from faults.json; run nothing")
    args = parser.parse_args()
    if args.replot:
        plot_result(json.loads((RESULTS / "faults.json").read_text()))
        return
    if args.quick:
        args.rounds, args.worlds, args.checkpoint_every, args.kill_at, args.after = 1, "2x1", 5, 8, 5
        args.duration, args.period = 80.0, 40.0
    sides, scenarios = args.sides.split(","), args.scenarios.split(",")
    for given, choices, option in ((sides, SIDES, "--sides"), (scenarios, SCENARIOS, "--scenarios")):
        if unknown := sorted(set(given) - set(choices)):
            parser.error(f"{option}: unknown {', '.join(unknown)}; choose from {','.join(choices)}")
    for world in [*args.worlds.split(","), args.goodput_world]:
        if not re.fullmatch(r"2x[1-9]\d*", world):
            parser.error(f"--worlds/--goodput-world: {world!r} is not 2xP (2 simulated nodes of P ranks), e.g. 2x1,2x2")
    skipped: dict[str, str] = {}
    if "shrink" in scenarios and (why := elastic_option()):
        skipped["ddlkit/shrink"] = why

    def shape_of(world: str) -> Shape:
        nodes, ppn = map(int, world.split("x"))
        return Shape(nodes, ppn, args.batch, args.image_size, args.num_classes, args.checkpoint_every)

    results: dict[str, Any] = {}
    goodput: dict[str, Any] = {}
    total = args.kill_at + args.after
    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ddlkit-faults-")))
        for world in args.worlds.split(","):
            shape = shape_of(world)
            by_side: dict[str, Any] = results.setdefault(world, {})
            refs = {side: reference_loss(side, shape, work, steps=total, backoff_s=args.backoff_s) for side in sides}
            print(f"{world}: reference losses at step {total}: {refs}", flush=True)
            for how in (h for h in scenarios if h != "goodput"):
                rounds = args.rounds
                for side in sides:
                    if f"{side}/{how}" in skipped:
                        continue
                    samples = []
                    for r in range(rounds):
                        sample = fault_round(
                            side,
                            how,
                            shape,
                            work,
                            kill_at=args.kill_at,
                            after=args.after,
                            backoff_s=args.backoff_s,
                            reference=refs[side],
                        )
                        samples.append(sample)
                        print(
                            f"{world} {how} {side} round {r + 1}/{rounds}: "
                            + json.dumps({k: v for k, v in sample.items() if k != "ddlkit_says"}),
                            flush=True,
                        )
                    by_side.setdefault(how, {})[side] = {**medians(samples), "samples": samples}
        if "goodput" in scenarios:
            shape = shape_of(args.goodput_world)
            free = {
                side: goodput_run(side, shape, work, duration=args.duration, period=None, backoff_s=args.backoff_s)
                for side in sides
            }
            failing: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for r in range(args.rounds):  # the sides take turns, so that a noisy minute hits both
                for side in sides:
                    failing[side].append(
                        goodput_run(
                            side, shape, work, duration=args.duration, period=args.period, backoff_s=args.backoff_s
                        )
                    )
                    print(
                        f"goodput {side} round {r + 1}/{args.rounds}: {failing[side][-1]['useful_steps']} useful "
                        f"steps with {failing[side][-1]['failures']} failures "
                        f"({free[side]['useful_steps']} without)",
                        flush=True,
                    )
            for side in sides:
                steps = [run["useful_steps"] for run in failing[side]]
                middle = failing[side][steps.index(sorted(steps)[len(steps) // 2])]  # the median run is plotted
                goodput[side] = {
                    "free": free[side],
                    "failing": middle,
                    "useful_steps": summary(steps),
                    "ratio_to_failure_free": round(middle["useful_steps"] / max(1, free[side]["useful_steps"]), 3),
                }
            if set(goodput) == set(SIDES):
                goodput["ddlkit_vs_torchrun"] = round(
                    goodput["ddlkit"]["failing"]["useful_steps"]
                    / max(1, goodput["torchrun"]["failing"]["useful_steps"]),
                    3,
                )
                goodput["ddlkit_vs_torchrun_by_round"] = [
                    round(d["useful_steps"] / max(1, t["useful_steps"]), 3)
                    for d, t in zip(failing["ddlkit"], failing["torchrun"], strict=True)
                ]
    payload = {
        "benchmark": "faults",
        "what": "restart and resume after node 1's ranks are killed at step s: ddlkit (compute=local_mpi, restart "
        "policy) vs torchrun's elastic agent (one agent per simulated node, c10d rendezvous on localhost) "
        "running a hand-written DDP loop; ResNet-18, synthetic data, CPU, one thread per rank",
        "how": {
            "t_detect_s": "kill -> every survivor rank's worker process has ended (polled every 5 ms)",
            "t_relaunch_s": "kill -> ddlkit's launcher submits the job again / torchrun's agent has started "
            "the new worker process (after its rendezvous); a part of t_resume_s",
            "t_resume_s": "kill -> the time rank 0 logged the first step after the restart (metrics.jsonl)",
            "steps_lost": "last step logged before the restart - the step resumed from",
            "bitwise": "loss at step s + after == that of a run of the same world size that never failed",
            "goodput": "the step counter at the end of a fixed wall time (steps lost and trained again count "
            "once) / the wall time, vs a failure-free run of the same length",
        },
        "shape": {
            "model": "resnet18",
            "image_size": args.image_size,
            "batch_per_rank": args.batch,
            "num_classes": args.num_classes,
            "checkpoint_every": args.checkpoint_every,
            "kill_at": args.kill_at,
            "after": args.after,
            "threads_per_rank": 1,
            "deterministic": True,
            "ddlkit_restart_backoff_s": args.backoff_s,
            "rounds": args.rounds,
            "quick": args.quick,
        },
        "torchrun": {
            "command": "python -m torch.distributed.run --nnodes=1:2 --nproc-per-node=P --max-restarts=N "
            "--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-conf=is_host=0|1 "
            "benchmarks/_torchrun_train.py ...",
            "environment": TORCHRUN_ENV,
            "rendezvous_defaults": "last_call_timeout 30 s",
        },
        "goal": GOALS,
        "results": results,
        "goodput": {**goodput, "world": args.goodput_world, "duration_s": args.duration, "period_s": args.period},
        "skipped": skipped,
    }
    path = write_result("faults", payload)
    if goodput:
        plot_result(payload)
    table = {
        world: {
            how: {
                side: {k: v.get(k, {}).get("median") for k in ("t_detect_s", "t_resume_s", "steps_lost")}
                | {"bitwise": v.get("bitwise")}
                for side, v in by_side.items()
            }
            for how, by_side in hows.items()
        }
        for world, hows in results.items()
    }
    print(json.dumps(table, indent=1))
    if skipped:
        print(f"skipped: {skipped}")
    print(f"wrote {path}" + (f" and {RESULTS / 'faults.png'}" if goodput else ""))


if __name__ == "__main__":
    main()
