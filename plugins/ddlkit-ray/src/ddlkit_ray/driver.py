"""The Ray job's driver: ``python -m ddlkit_ray.driver ray-job.json``, the entrypoint of every
``compute=ray`` job, run by Ray on the cluster in a copy of the job directory (the job's
``working_dir``, which Ray uploaded from the launcher: ``job.json``, the config copies, the code
snapshot ``code/``, the checkpoints of an earlier run).

What it does, in order:

1. **places the gang**: one placement group, one bundle per node of ``procs_per_node`` x the
   rank's resources, ``STRICT_SPREAD`` over ``nodes`` nodes (``STRICT_PACK`` for one node), so
   that the job gets all its ranks or none, each node ``procs_per_node`` of them. While the
   cluster lacks the capacity it waits (saying so) up to ``placement_timeout_s``, then fails
   naming what it asked for and what the cluster has;
2. **starts the ranks**: one actor per rank in its node's bundle. The actors of a node copy the
   job directory to a directory of the node's own (the ranks' working directory) and start
   ``python -m ddlkit_ray.rank -- python -m ddlkit.rank.worker job.json`` there with the rank
   variables ddlkit reads (:data:`LAYOUT`), rank 0's node address and two free ports of it for the
   rendezvous (``MASTER_ADDR``/``MASTER_PORT``, ddlkit's control plane on the next port);
3. **is the job's console**: rank 0's output, and the other ranks' error lines, go to the driver's
   output, which Ray keeps as the job's log (what ``JobHandle.logs`` streams);
4. **keeps the ranks' files**: every ``sync_interval_s`` it copies what the ranks wrote since the
   last look (checkpoints, metrics, logs) into a directory of its own, so that a node that dies
   does not take rank 0's checkpoints with it; when the job ends it takes the rest, and publishes
   the whole as one archive where Ray's log API serves it (:func:`published_name`), with
   :data:`EXIT_RECORD`: that is how ``collect()`` brings the files back to the launcher, which
   shares no disk with the cluster. A job that did not complete leaves that directory on its node
   (:data:`KEPT_DIR`, named by the job directory's key, not by the run): the next run of the job
   -- a restart, a resume after a cancel -- starts its ranks with those files (checkpoints) sent
   through Ray's object store, and the launcher does not upload them again (Ray's Jobs API takes
   no package over 100 MiB, and a checkpoint of ResNet-50 alone is bigger);
5. **stops on SIGTERM** (``ray job stop``, ddlkit's cancel): SIGTERM to every rank, which
   checkpoints and exits ``EXIT_PREEMPTED``; ranks still running after ``grace_period_s`` are killed;
6. **restarts the gang in place** when the infrastructure ended it (a node lost, a rank killed from
   outside, ranks stopped on a preemption notice) and the job's restart policy allows it (the plan's
   ``restart``: :class:`ddlkit.RestartBudget`, applied by ddlkit's own
   :class:`~ddlkit.compute.restarts.RestartPolicy`, which says the restart on the job's console as
   the launcher would): while the cluster has enough nodes for the whole gang, it places the gang
   again and starts the ranks with the files it kept (they resume from the newest verified
   checkpoint), without ending the Ray job -- no new submission, no new driver, no files going
   to the launcher and back. The exit record lists these restarts for the launcher's count;
7. **ends as the job** otherwise: with the status of the rank that failed first, as ddlkit's one
   rule judges it (:func:`ddlkit.compute.outcome.judge`) from the exit records the ranks' minders
   wrote (``.ranks/``, which come here with the ranks' other files); a rank whose node was lost counts
   as killed by SIGKILL (its exit record says so, written here; the driver ends with 137), which
   ddlkit's restart policy restarts (the launcher
   submits the job again, with the checkpoints that came back; an elastic job on the nodes the
   cluster has left, less those the exit record names as lost).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddlkit.compute import secret_file
from ddlkit.compute.layout import RankLayout
from ddlkit.compute.outcome import Observation, judge
from ddlkit.compute.ports import free_ports
from ddlkit.compute.rank_exits import read_records
from ddlkit.compute.restarts import RestartPolicy, classify
from ddlkit.compute.resume import files_to_leave, resume_setting
from ddlkit.interfaces import JobState, JobStatus, RestartBudget
from ddlkit.jobdir import (
    CHECKPOINT_DIR,
    CODE_DIR,
    EXIT_CONFIG_ERROR,
    EXIT_PREEMPTED,
    JOB_FILE,
    RANKS_DIR,
    RESTARTS_ENV,
    STATE_DIR,
    STEPS_LOST_ENV,
    TELEMETRY_FILE,
    rank_log,
    rank_record,
)

#: the driver's plan, written by the launcher into the job directory (no secret in it)
PLAN_FILE = "ray-job.json"
#: the job's secrets (``JobSpec.secret_env``): a file readable by its user alone, which goes up with the
#: working_dir and nowhere else -- Ray writes a job's runtime environment, env_vars and all, into
#: runtime_env_agent.log on every node. The launcher removes its copy once the job is submitted; the
#: driver reads the one Ray unpacked and removes it, keeps the secrets in memory and hands them to the
#: ranks as an actor call's argument; every rank actor removes the copy Ray unpacked on its node.
SECRETS_FILE = ".ddlkit-ray-secrets.json"
#: how the job ended, in the published files (relative to the job directory): the launcher's status
EXIT_RECORD = f"{STATE_DIR}/ray-exit.json"
#: where the published files live in the driver node's Ray log directory
PUBLISH_DIR = "ddlkit"
#: a rank whose node was lost ended as if killed by SIGKILL: the restart policy's "from outside"
EXIT_NODE_LOST = 128 + signal.SIGKILL
#: what the ranks' files leave out: the shipped code and the job's bookkeeping
NOT_COLLECTED = (CODE_DIR, STATE_DIR, PLAN_FILE)
#: seconds between looks at the ranks
_PACE_S = 0.2
#: what a run that did not complete left for the next run of its job, below the driver node's Ray log
#: directory (where the launcher can ask for ``KEPT_MARK`` through the log API): one directory per job
KEPT_DIR = f"{PUBLISH_DIR}/kept"
#: the file that says a kept directory is complete (written last); the launcher looks for it
KEPT_MARK = "kept.json"
#: a kept directory no run has touched for this long is deleted by the next driver on its node
KEPT_DAYS = 7

log = logging.getLogger("ddlkit_ray")


def published_name(submission_id: str, what: str) -> str:
    """The file (relative to the driver node's Ray log directory) that holds ``what``
    (``files.tar`` or ``exit.json``) of the job ``submission_id``."""
    return f"{PUBLISH_DIR}/{submission_id}/{what}"


def kept_name(key: str, what: str = KEPT_MARK) -> str:
    """The file ``what`` of the job ``key``'s kept directory, relative to the Ray log directory."""
    return f"{KEPT_DIR}/{key}/{what}"


def say(text: str) -> None:
    print(f"ddlkit-ray: {text}", file=sys.stderr, flush=True)


def _without_secrets(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: the secrets file at the top of the working_dir (another rank of the node
    may not have removed it yet)."""
    return [SECRETS_FILE] if SECRETS_FILE in names and Path(directory) == Path.cwd() else []


# ---------------------------------------------------------------------------- the rank actor
class Rank:
    """One rank, as a Ray actor placed in its node's bundle (made remote in :func:`main`)."""

    def __init__(self, submission_id: str, node: int) -> None:
        self.submission_id, self.node = submission_id, node
        self.process: subprocess.Popen[bytes] | None = None
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.lock = threading.Lock()
        self.sent: dict[str, tuple[int, int]] = {}
        # the ranks of a node share one working directory, as on any cluster node; never Ray's
        # copy of the working_dir, which Ray manages (and may share between nodes on one disk)
        self.job_dir = Path(tempfile.gettempdir()) / "ddlkit-ray" / submission_id / f"node-{node}"

    def where(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_ports(self) -> int:
        """A port such that it and the next one are free on this node (the framework's rendezvous
        and ddlkit's control plane), where no connection is handed them meanwhile."""
        return free_ports(2, host="")[0]

    def _prepare(self, kept: list[Any]) -> None:
        """The node's copy of the job directory: the working_dir Ray unpacked (without the secrets
        file, which goes: the driver sends the secrets), and the files an earlier run of the job kept
        on the driver's node (``kept``: a reference to their tar, or nothing), fetched by the first
        rank of the node only."""
        import fcntl

        import ray

        secret_file.remove(Path.cwd(), SECRETS_FILE)  # Ray's copy of the working_dir on this node
        self.job_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.job_dir}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other ranks wait for the one copy
            if not self.job_dir.is_dir():
                staging = self.job_dir.with_name(self.job_dir.name + ".partial")
                shutil.rmtree(staging, ignore_errors=True)
                shutil.copytree(os.getcwd(), staging, symlinks=True, ignore=_without_secrets)
                if kept:
                    with tarfile.open(fileobj=io.BytesIO(ray.get(kept[0]))) as tar:
                        extract_files(tar, staging)
                staging.rename(self.job_dir)
        # what is there now is not the ranks' to send back: the driver has it, or it is the code
        self.sent = {
            p.relative_to(self.job_dir).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.job_dir.rglob("*")
            if p.is_file()
        }

    def start(self, python: str | None, args: list[str], variables: dict[str, str], kept: list[Any]) -> int:
        """Start the rank: ``python args...`` under its minder; without ``python``, this actor's
        own interpreter (the cluster's Python, which has Ray and ddlkit)."""
        self._prepare(kept)
        python = python or sys.executable
        self.process = subprocess.Popen(
            [python, "-m", "ddlkit_ray.rank", "--", python, *args],
            cwd=self.job_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **variables, "PYTHONUNBUFFERED": "1"},
        )
        for stream, sink in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()
        return self.process.pid

    def _pump(self, stream: Any, sink: list[bytes]) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self.lock:
                sink.append(chunk)

    def poll(self) -> tuple[bytes, bytes, int | None]:
        """What the rank printed since the last poll, and its exit status once it ended."""
        code = None if self.process is None else self.process.poll()
        if code is not None:
            time.sleep(0.05)  # the pipes' last bytes
        with self.lock:
            out, err = b"".join(self.out), b"".join(self.err)
            self.out.clear()
            self.err.clear()
        return out, err, code

    def stop(self) -> None:
        """SIGTERM to the rank (its minder passes it to the worker, which checkpoints)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the rank that did not stop when asked (a stopped or hung one): to its minder, whose
        death kills the worker (the minder's death signal). The actor stays, to hand over the node's
        files (the stacks the ranks wrote of a hang among them)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def changes(self) -> tuple[bytes, list[str]]:
        """A tar of the files the rank's directory gained or changed since the last call, and the
        checkpoints it holds now (the driver forgets those the rank pruned)."""
        buffer = io.BytesIO()
        checkpoints = []
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(self.job_dir.rglob("*")):
                rel = path.relative_to(self.job_dir).as_posix()
                if rel.startswith(f"{CHECKPOINT_DIR}/"):
                    checkpoints.append(rel)
                if (
                    rel.split("/")[0] in NOT_COLLECTED
                    or not path.is_file()
                    or path.is_symlink()
                    or rel.endswith((".tmp", ".partial"))
                ):
                    continue
                stat = path.stat()
                if self.sent.get(rel) == (stat.st_size, stat.st_mtime_ns):
                    continue
                try:
                    tar.add(path, arcname=rel)
                except OSError:  # gone meanwhile (a checkpoint pruned)
                    continue
                self.sent[rel] = (stat.st_size, stat.st_mtime_ns)
        return buffer.getvalue(), checkpoints

    def cleanup(self) -> None:
        shutil.rmtree(self.job_dir.parent, ignore_errors=True)


# ---------------------------------------------------------------------------- the driver


def holds(resources: dict[str, float] | None, bundle: dict[str, float]) -> bool:
    """Whether a node with these total resources can hold one node's share of the gang (the
    launcher's check of the cluster and the driver's of live nodes before a restart in place)."""
    return all((resources or {}).get(k, 0) >= v for k, v in bundle.items() if v > 0)


class Driver:
    def __init__(self, plan: dict[str, Any], secrets: dict[str, str] | None = None) -> None:
        self.plan = plan
        #: the job's secret environment, in this process's memory only (SECRETS_FILE)
        self.secrets = dict(secrets or {})
        self.sid: str = plan["submission_id"]
        self.nodes, self.ppn = int(plan["nodes"]), int(plan["procs_per_node"])
        self.world = self.nodes * self.ppn
        self.stop_requested = threading.Event()
        import ray

        # Ray's private module: there is no public API for the node's log directory
        self.logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
        #: the ranks' files, kept here between the runs of the job until it completes
        self.collected = self.logs / KEPT_DIR / plan["key"]
        self.collected.mkdir(parents=True, exist_ok=True)
        #: whether this run holds the job's files: not when the files an earlier run kept here are gone
        #: (it ends at once, and must not leave a mark that says this empty directory is the job's)
        self.holds_files = True
        self.actors: list[Any] = []
        self.pg: Any = None
        self.lost: dict[int, str] = {}
        #: when the driver lost each of them
        self.lost_at: dict[int, float] = {}
        #: the Ray node id each rank runs on, once started
        self.node_ids: list[str] = []
        #: the Ray node ids of the nodes the job lost: the exit record names them, so that the launcher
        #: counts them out before the GCS has noticed (RayTarget.nodes_up)
        self.lost_nodes: set[str] = set()
        #: the kept checkpoints this run's ranks were not sent (older than the one they resume from):
        #: kept here, where rank 0's rotation does not reach them, until it has written one of its own
        self.left_behind: set[str] = set()
        #: the checkpoint files they were sent: anything else rank 0 holds, it wrote
        self.sent_checkpoints: set[str] = set()
        #: the job's restart policy, for restarts in place (None: the launcher's alone)
        budget = plan.get("restart")
        self.policy = RestartPolicy.from_budget(RestartBudget(**budget), sys.stderr) if budget else None
        #: the restarts made in place: the policy's entries, for the exit record
        self.restarts: list[dict[str, Any]] = []
        #: how the last gang ended (the rank that failed first, or the nodes lost), once it did
        self.ended: JobStatus | None = None

    # ------------------------------------------------------------ placement
    def bundle(self) -> dict[str, float]:
        cpus, gpus = float(self.plan["cpus_per_rank"]), float(self.plan["gpus_per_rank"])
        return {k: v * self.ppn for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}

    @property
    def strategy(self) -> str:
        return self.plan.get("strategy") or ("STRICT_SPREAD" if self.nodes > 1 else "STRICT_PACK")

    def place(self) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        strategy = self.strategy
        bundle = self.bundle()
        pg = placement_group([dict(bundle) for _ in range(self.nodes)], strategy=strategy, name=f"ddlkit-{self.sid}")
        timeout = float(self.plan["placement_timeout_s"])
        deadline = time.monotonic() + timeout
        said = False
        while True:
            ready, _ = ray.wait([pg.ready()], timeout=1.0)
            if ready:
                return pg
            if self.stop_requested.is_set():
                return None
            if not said:
                say(
                    f"waiting for the gang: {self.nodes} node(s) with {_resources(bundle)} each ({strategy}); "
                    f"the cluster has {_cluster(ray)} free"
                )
                said = True
            if time.monotonic() > deadline:
                ray.util.remove_placement_group(pg)
                raise Unplaceable(
                    f"the cluster did not have room for the job's {self.world} rank(s) within "
                    f"compute.placement_timeout_s={timeout:g}: it asks for {self.nodes} node(s) with "
                    f"{_resources(bundle)} each ({strategy}); the cluster has {_cluster(ray)} free on "
                    f"{_alive_nodes(ray)} live node(s)"
                )

    # ------------------------------------------------------------ the ranks
    def start(self, pg: Any) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(max_restarts=0, max_concurrency=4)(Rank)
        cpus, gpus = float(self.plan["cpus_per_rank"]), float(self.plan["gpus_per_rank"])
        for rank in range(self.world):
            node = rank // self.ppn
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=node)
            self.actors.append(
                remote.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=strategy).remote(self.sid, node)
            )
        places = ray.get([a.where.remote() for a in self.actors])
        self.node_ids = [node_id for _, node_id in places]
        # rank 0's node as the cluster knows it (the address its raylet was started with)
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        master = addresses.get(places[0][1], places[0][0])
        port = ray.get(self.actors[0].free_ports.remote())
        python = self.plan.get("python")
        args = list(self.plan["args"])
        kept = self.kept()
        pids = []
        for rank, actor in enumerate(self.actors):
            node, local = divmod(rank, self.ppn)
            variables: dict[str, object] = dict(
                RankLayout(rank, self.world, local, self.ppn, node, master, port).to_env()
            )
            if self.policy is not None:  # the restarts so far, for result.json (the launcher's, and ours)
                variables |= {RESTARTS_ENV: self.policy.done, STEPS_LOST_ENV: self.policy.steps_lost}
            pids.append(
                actor.start.remote(python, args, {**{k: str(v) for k, v in variables.items()}, **self.secrets}, kept)
            )
        ray.get(pids)
        nodes = sorted({(rank // self.ppn, places[rank][1][:8]) for rank in range(self.world)})
        say(
            f"{self.world} rank(s) started on node(s) "
            + ", ".join(f"{i} ({nid})" for i, nid in nodes)
            + f"; rendezvous {master}:{port}"
        )

    def kept(self) -> list[Any]:
        """What an earlier run of the job kept here, for the ranks' nodes: ``[reference to a tar]`` in
        Ray's object store (a list: an actor's argument, fetched only by the rank that prepares
        its node), or ``[]``."""
        import ray

        files = [
            p
            for p in sorted(self.collected.rglob("*"))
            if p.is_file() and p.relative_to(self.collected).as_posix() not in (KEPT_MARK, EXIT_RECORD)
        ]
        if not files:
            return []
        # the ranks load one checkpoint: the older ones stay here (the job file, in this driver's
        # working directory, says which one the ranks choose)
        if leave := set(files_to_leave(self.collected, resume_setting(Path(JOB_FILE)))):
            files = [p for p in files if p not in leave]
            self.left_behind = {p.relative_to(self.collected).as_posix() for p in leave}
            self.sent_checkpoints = {
                name
                for p in files
                if (name := p.relative_to(self.collected).as_posix()).startswith(f"{CHECKPOINT_DIR}/")
            }
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in files:
                tar.add(path, arcname=path.relative_to(self.collected).as_posix())
        say(
            f"{len(files)} file(s) of the job's last run kept on this node ({buffer.tell() / 2**20:.1f} MiB) go to "
            "the ranks' nodes"
            + (f"; {len(self.left_behind)} file(s) of older checkpoints stay here" if self.left_behind else "")
        )
        return [ray.put(buffer.getvalue())]

    def sync(self, ranks: list[int]) -> None:
        """Copy what the ranks wrote since the last look into the driver's directory (rank 0 last:
        its files win)."""
        import ray

        for rank in sorted(ranks, reverse=True):
            if rank in self.lost:
                continue
            try:
                data, checkpoints = ray.get(self.actors[rank].changes.remote(), timeout=120)
            except Exception as exc:  # a lost node's files are lost with it
                self._lose(rank, exc)
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                extract_files(tar, self.collected)
            if rank == 0:  # rank 0 writes the checkpoints, and prunes them (trainer.keep_checkpoints)
                held = set(checkpoints)
                if self.left_behind and not held <= self.sent_checkpoints:
                    self.left_behind = set()  # it wrote one of its own: its rotation speaks for them all
                for path in (self.collected / CHECKPOINT_DIR).glob("*"):
                    name = path.relative_to(self.collected).as_posix()
                    if path.is_file() and name not in held and name not in self.left_behind:
                        path.unlink(missing_ok=True)

    def _lose(self, rank: int, exc: BaseException) -> None:
        if rank not in self.lost:
            node = rank // self.ppn
            self.lost[rank] = f"rank {rank}'s node ({node}) was lost: {type(exc).__name__}"
            self.lost_at[rank] = time.time()
            if rank < len(self.node_ids):
                self.lost_nodes.add(self.node_ids[rank])
            say(self.lost[rank])

    def run(self) -> int:
        if self.plan.get("kept_on_cluster") and not (self.collected / KEPT_MARK).is_file():
            # the launcher left the checkpoints behind because this node kept them, and they are gone
            # since (the node's log directory cleaned): a restart ships them from the launcher
            say(
                "the files the job's last run kept on this node are gone: the next run brings them from the "
                "launcher's job directory"
            )
            self.holds_files = False
            return EXIT_NODE_LOST
        while True:
            code = self.run_gang()
            if not self.restart_in_place(code):
                return code

    def run_gang(self) -> int:
        """Place the gang, start its ranks and follow them to their end; the job's exit status."""
        import ray

        pg = self.place()
        if pg is None:
            return EXIT_PREEMPTED
        self.pg = pg
        # the exit records of this gang's ranks come here (sync): an earlier gang's are not theirs
        shutil.rmtree(self.collected / RANKS_DIR, ignore_errors=True)
        self.start(pg)
        codes: dict[int, int] = {}
        stopping_since: float | None = None
        last_sync = time.monotonic()
        sync_every = float(self.plan["sync_interval_s"])
        grace = float(self.plan["grace_period_s"])
        while len(codes) < self.world:
            if self.stop_requested.is_set() and stopping_since is None:
                say(f"stop requested: the ranks checkpoint and stop (at most compute.grace_period_s={grace:g} s)")
                self._stop_all(codes)
                stopping_since = time.monotonic()
            for rank, actor in enumerate(self.actors):
                if rank in codes:
                    continue
                try:
                    out, err, code = ray.get(actor.poll.remote(), timeout=30)
                except Exception as exc:  # the actor died with its node
                    self._lose(rank, exc)
                    out, err, code = b"", b"", EXIT_NODE_LOST
                if out:
                    sys.stdout.buffer.write(out)
                    sys.stdout.flush()
                if err:
                    sys.stderr.buffer.write(err)
                    sys.stderr.flush()
                if code is not None:
                    codes[rank] = code
                    if code != 0 and stopping_since is None and len(codes) < self.world:
                        say(f"rank {rank} ended with exit status {code}: stopping the other ranks")
                        self._stop_all(codes)
                        stopping_since = time.monotonic()
            if stopping_since is not None and time.monotonic() - stopping_since > grace + 5:
                say(
                    f"rank(s) {sorted(set(range(self.world)) - set(codes))} did not stop within "
                    f"{grace:g} s: killing them"
                )
                for rank in set(range(self.world)) - set(codes):
                    try:  # the rank's process, not its actor: the node is not lost, and its files still come
                        ray.get(self.actors[rank].kill.remote(), timeout=30)
                    except Exception:  # the actor does not answer either
                        ray.kill(self.actors[rank])
                    codes[rank] = 128 + signal.SIGKILL
            if time.monotonic() - last_sync > sync_every:
                self.sync([0])
                self.publish_telemetry()
                last_sync = time.monotonic()
            time.sleep(_PACE_S)
        self.sync(list(range(self.world)))
        for rank, actor in enumerate(self.actors):
            if rank not in self.lost:
                try:
                    ray.get(actor.cleanup.remote(), timeout=30)
                except Exception:  # nothing to clean on a lost node
                    pass
        if self.lost:
            self.record_lost()
            self.ended = JobStatus(JobState.FAILED, EXIT_NODE_LOST, "; ".join(self.lost.values()))
            return EXIT_NODE_LOST
        if self.stop_requested.is_set():
            return codes.get(0, EXIT_PREEMPTED) or EXIT_PREEMPTED
        self.ended = self.judge(codes)
        code = self.ended.exit_code or 0
        return 128 - code if code < 0 else code  # a rank killed by signal N: 128 + N, the shell's way

    def judge(self, codes: dict[int, int]) -> JobStatus:
        """How the gang ended, by ddlkit's one rule (:func:`ddlkit.compute.outcome.judge`): the
        rank that failed first, from the exit records the ranks' minders wrote, which the last sync
        brought here; ``codes``: the ranks' exit statuses, as their actors saw them."""
        reported = {int(r["rank"]) for r in read_records(self.collected)}
        unreported = {rank: code for rank, code in sorted(codes.items()) if rank not in reported}
        seen = Observation(
            JobState.FAILED if any(codes.values()) else JobState.SUCCEEDED,
            exit_code=next((code for _, code in sorted(codes.items()) if code), None),
            rank_signals={rank: 128 - code if code > 128 else code for rank, code in unreported.items() if code},
            # every rank's minder has written its record by the time its actor saw it end
            ranks_always_report=True,
        )
        return judge(seen, self.collected, job=f"the gang of Ray job {self.sid}", world_size=self.world)

    def record_lost(self) -> None:
        """The exit records of the ranks lost with their nodes, which their minders could not leave
        here: each ended, as the driver saw it, as if killed by SIGKILL when the driver lost it, so
        that the job's records name it and :func:`~ddlkit.compute.outcome.judge` weighs it with the
        others (a rank that ended before its node was lost, and whose record came here, keeps its own)."""
        for rank, why in self.lost.items():
            path = self.collected / rank_record(rank)
            if path.is_file():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            node, local = divmod(rank, self.ppn)
            record = {
                "rank": rank,
                "node": node,
                "local_rank": local,
                "code": -signal.SIGKILL,
                "time": self.lost_at[rank],
                "log": rank_log(rank),
                "lost": why,
            }
            path.write_text(json.dumps(record) + "\n", encoding="utf-8")

    def restart_in_place(self, code: int) -> bool:
        """Whether the gang that ended with ``code`` starts again here, under the job's restart
        policy: the infrastructure ended it, the policy has restarts left, and the cluster has
        enough live nodes for the whole gang. Otherwise the job ends, and the launcher decides (an
        elastic job goes on with fewer nodes; a job that needs all of them waits for capacity)."""
        import ray

        if self.policy is None or code == 0 or self.stop_requested.is_set() or self.ended is None:
            return False
        status = self.ended
        verdict = classify(status)
        if not self.policy.allows(verdict):
            return False
        self.release()
        if (fit := self.nodes_that_fit(ray)) < self.nodes:
            say(
                f"{fit} live node(s) can take a node's share of the gang, {self.nodes} needed: the job ends here and "
                "the launcher restarts it"
            )
            return False
        entry = self.policy.plan_restart(verdict, status, self.collected, resume_setting(Path(JOB_FILE)), in_place=True)
        self.restarts.append(entry)
        if self.stop_requested.wait(float(entry["wait_s"])):
            return False
        self.actors, self.node_ids, self.lost, self.lost_at, self.ended = [], [], {}, {}, None
        self.left_behind, self.sent_checkpoints = set(), set()
        return True

    def nodes_that_fit(self, ray: Any) -> int:
        """Live nodes, less those the job lost, that can hold one node's share of the gang (their
        whole resources: what other jobs use now is the placement's to wait for)."""
        bundle = self.bundle()
        fit = sum(
            1
            for n in ray.nodes()
            if n.get("Alive") and n["NodeID"] not in self.lost_nodes and holds(n.get("Resources"), bundle)
        )
        return fit if self.strategy.endswith("SPREAD") else min(fit, 1) * self.nodes

    def release(self) -> None:
        """Give back what the ended gang holds: its actors (those on a live node) and its placement group."""
        import ray

        for rank, actor in enumerate(self.actors):
            if rank not in self.lost:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.pg)
            self.pg = None

    def _stop_all(self, codes: dict[int, int]) -> None:
        for rank, actor in enumerate(self.actors):
            if rank not in codes and rank not in self.lost:
                actor.stop.remote()

    def publish_telemetry(self) -> None:
        """Rank 0's step telemetry as the last sync brought it, where the launcher's ``ddlkit jobs
        status`` reads it while the job runs (the rest comes at the end, in one archive)."""
        view = self.collected / TELEMETRY_FILE
        with contextlib.suppress(OSError):  # none yet (one rank, no logging step), or a lost race
            target = self.logs / PUBLISH_DIR / self.sid
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(view, target / f"{TELEMETRY_FILE}.partial")
            os.replace(target / f"{TELEMETRY_FILE}.partial", target / TELEMETRY_FILE)

    # ------------------------------------------------------------ the end
    def publish(self, code: int, why: str) -> None:
        """The ranks' files and the exit record, where Ray's log API serves them to the launcher;
        the files stay on this node for the job's next run unless it completed."""
        import ray

        keep = code != 0 and self.holds_files
        record = {
            "submission_id": self.sid,
            "code": code,
            "why": why,
            "lost": sorted(self.lost.values()),
            "lost_nodes": sorted(self.lost_nodes),
            "time": time.time(),
            "restarts": self.restarts,
            # where the next run finds this run's files (the launcher asks for KEPT_MARK there)
            "kept": {"key": self.plan["key"], "node_id": ray.get_runtime_context().get_node_id()} if keep else None,
        }
        (self.collected / KEPT_MARK).unlink(missing_ok=True)
        (self.collected / STATE_DIR).mkdir(exist_ok=True)
        (self.collected / EXIT_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")
        target = self.logs / PUBLISH_DIR / self.sid
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / "files.tar.partial"
        with tarfile.open(tmp, "w") as tar:
            tar.add(self.collected, arcname=".")
        os.replace(tmp, target / "files.tar")
        if keep:
            (self.collected / KEPT_MARK).write_text(json.dumps(record) + "\n", encoding="utf-8")
        else:
            shutil.rmtree(self.collected, ignore_errors=True)
        # last: its presence says the archive is complete
        (target / "exit.json.partial").write_text(json.dumps(record) + "\n", encoding="utf-8")
        os.replace(target / "exit.json.partial", target / "exit.json")

    def forget_old_jobs(self) -> None:
        """Delete what jobs that never ran again kept on this node (no run for :data:`KEPT_DAYS`)."""
        for kept in (self.logs / KEPT_DIR).glob("*"):
            stamp = kept / KEPT_MARK if (kept / KEPT_MARK).is_file() else kept  # no mark: a driver that died
            if kept != self.collected and time.time() - stamp.stat().st_mtime > KEPT_DAYS * 86400:
                shutil.rmtree(kept, ignore_errors=True)


def extract_files(tar: tarfile.TarFile, into: Path, skip: Callable[[str], bool] = lambda name: False) -> None:
    """The regular files of ``tar`` (less those ``skip`` names) into ``into``, each replaced whole
    (no path may leave it)."""
    for member in tar.getmembers():
        name = member.name.removeprefix("./")
        if not member.isfile() or name.startswith("/") or ".." in name.split("/") or skip(name):
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(member)
        assert source is not None
        tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
        with open(tmp, "wb") as f:
            shutil.copyfileobj(source, f)
        os.replace(tmp, target)


class Unplaceable(Exception):
    """The gang did not fit within the placement timeout."""


def _resources(bundle: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items()) or "no resources"


def _cluster(ray: Any) -> str:
    free = ray.available_resources()
    return ", ".join(f"{free.get(k, 0):g} {k}" for k in ("CPU", "GPU"))


def _alive_nodes(ray: Any) -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(argv[0] if argv else PLAN_FILE).read_text(encoding="utf-8"))
    # first thing: the file Ray unpacked does not outlive the driver's start
    secrets = secret_file.read(Path.cwd(), SECRETS_FILE)
    secret_file.remove(Path.cwd(), SECRETS_FILE)
    import ray

    ray.init(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True)
    driver = Driver(plan, secrets)
    driver.forget_old_jobs()
    # after ray.init, which installs handlers of its own: a stop (ray job stop, ddlkit's cancel) is
    # the ranks' to act on -- they checkpoint -- not the end of this process
    signal.signal(signal.SIGTERM, lambda signum, frame: driver.stop_requested.set())
    signal.signal(signal.SIGINT, lambda signum, frame: driver.stop_requested.set())
    why = ""
    try:
        code = driver.run()
        why = "; ".join(driver.lost.values())
    except Unplaceable as exc:
        say(str(exc))
        code, why = EXIT_CONFIG_ERROR, str(exc)
    driver.publish(code, why)
    say(f"the job ended with exit status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
