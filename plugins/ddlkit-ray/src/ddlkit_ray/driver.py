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
   shares no disk with the cluster;
5. **stops on SIGTERM** (``ray job stop``, ddlkit's cancel): SIGTERM to every rank, which
   checkpoints and exits ``EXIT_PREEMPTED``; ranks still running after ``grace_period_s`` are killed;
6. **ends as the job**: with the status of the rank that failed first; a rank whose node was lost
   counts as killed by SIGKILL (137), which ddlkit's restart policy restarts (the launcher submits
   the job again, with the checkpoints that came back; an elastic job on the nodes the cluster has
   left, less those the exit record names as lost).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ddlkit.jobdir import (CODE_DIR, EXIT_CONFIG_ERROR, EXIT_PREEMPTED, STATE_DIR)

#: the driver's plan, written by the launcher into the job directory (no secret in it)
PLAN_FILE = "ray-job.json"
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

log = logging.getLogger("ddlkit_ray")


def published_name(submission_id: str, what: str) -> str:
    """The file (relative to the driver node's Ray log directory) that holds ``what``
    (``files.tar`` or ``exit.json``) of the job ``submission_id``."""
    return f"{PUBLISH_DIR}/{submission_id}/{what}"


def say(text: str) -> None:
    print(f"ddlkit-ray: {text}", file=sys.stderr, flush=True)


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
        and ddlkit's control plane)."""
        for _ in range(200):
            with socket.socket() as a:
                a.bind(("", 0))
                port = a.getsockname()[1]
                if port >= 65535:
                    continue
                with socket.socket() as b:
                    try:
                        b.bind(("", port + 1))
                    except OSError:
                        continue
                return port
        raise RuntimeError("no two consecutive free ports on this node")

    def _prepare(self) -> None:
        import fcntl

        self.job_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.job_dir}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other ranks wait for the one copy
            if not self.job_dir.is_dir():
                staging = self.job_dir.with_name(self.job_dir.name + ".partial")
                shutil.rmtree(staging, ignore_errors=True)
                shutil.copytree(os.getcwd(), staging, symlinks=True)
                staging.rename(self.job_dir)

    def start(self, python: str | None, args: list[str], variables: dict[str, str]) -> int:
        """Start the rank: ``python args...`` under its minder; without ``python``, this actor's
        own interpreter (the cluster's Python, which has Ray and ddlkit)."""
        self._prepare()
        python = python or sys.executable
        self.process = subprocess.Popen(
            [python, "-m", "ddlkit_ray.rank", "--", python, *args], cwd=self.job_dir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **variables, "PYTHONUNBUFFERED": "1"})
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

    def changes(self) -> bytes:
        """A tar of the files the rank's directory gained or changed since the last call."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(self.job_dir.rglob("*")):
                rel = path.relative_to(self.job_dir).as_posix()
                if rel.split("/")[0] in NOT_COLLECTED or not path.is_file() or path.is_symlink() \
                        or rel.endswith((".tmp", ".partial")):
                    continue
                stat = path.stat()
                if self.sent.get(rel) == (stat.st_size, stat.st_mtime_ns):
                    continue
                try:
                    tar.add(path, arcname=rel)
                except OSError:  # gone meanwhile (a checkpoint pruned)
                    continue
                self.sent[rel] = (stat.st_size, stat.st_mtime_ns)
        return buffer.getvalue()

    def cleanup(self) -> None:
        shutil.rmtree(self.job_dir.parent, ignore_errors=True)


# ---------------------------------------------------------------------------- the driver
class Driver:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.sid: str = plan["submission_id"]
        self.nodes, self.ppn = int(plan["nodes"]), int(plan["procs_per_node"])
        self.world = self.nodes * self.ppn
        self.stop_requested = threading.Event()
        self.collected = Path(tempfile.gettempdir()) / "ddlkit-ray" / f"{self.sid}-driver"
        self.collected.mkdir(parents=True, exist_ok=True)
        self.actors: list[Any] = []
        self.lost: dict[int, str] = {}
        #: the Ray node id each rank runs on, once started
        self.node_ids: list[str] = []
        #: the Ray node ids of the nodes the job lost: the exit record names them, so that the launcher
        #: counts them out before the GCS has noticed (RayTarget.nodes_up)
        self.lost_nodes: set[str] = set()

    # ------------------------------------------------------------ placement
    def bundle(self) -> dict[str, float]:
        cpus, gpus = float(self.plan["cpus_per_rank"]), float(self.plan["gpus_per_rank"])
        return {k: v * self.ppn for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}

    def place(self) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        strategy = self.plan.get("strategy") or ("STRICT_SPREAD" if self.nodes > 1 else "STRICT_PACK")
        bundle = self.bundle()
        pg = placement_group([dict(bundle) for _ in range(self.nodes)], strategy=strategy,
                             name=f"ddlkit-{self.sid}")
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
                say(f"waiting for the gang: {self.nodes} node(s) with {_resources(bundle)} each ({strategy}); "
                    f"the cluster has {_cluster(ray)} free")
                said = True
            if time.monotonic() > deadline:
                ray.util.remove_placement_group(pg)
                raise Unplaceable(
                    f"the cluster did not have room for the job's {self.world} rank(s) within "
                    f"compute.placement_timeout_s={timeout:g}: it asks for {self.nodes} node(s) with "
                    f"{_resources(bundle)} each ({strategy}); the cluster has {_cluster(ray)} free on "
                    f"{_alive_nodes(ray)} live node(s)")

    # ------------------------------------------------------------ the ranks
    def start(self, pg: Any) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(max_restarts=0, max_concurrency=4)(Rank)
        cpus, gpus = float(self.plan["cpus_per_rank"]), float(self.plan["gpus_per_rank"])
        for rank in range(self.world):
            node = rank // self.ppn
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=node)
            self.actors.append(remote.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=strategy)
                               .remote(self.sid, node))
        places = ray.get([a.where.remote() for a in self.actors])
        self.node_ids = [node_id for _, node_id in places]
        # rank 0's node as the cluster knows it (the address its raylet was started with)
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        master = addresses.get(places[0][1], places[0][0])
        port = ray.get(self.actors[0].free_ports.remote())
        python = self.plan.get("python")
        args = list(self.plan["args"])
        pids = []
        for rank, actor in enumerate(self.actors):
            node, local = divmod(rank, self.ppn)
            variables = {"RANK": rank, "WORLD_SIZE": self.world, "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": self.ppn,
                         "GROUP_RANK": node, "DDLKIT_NODE": node, "DDLKIT_LOCAL_RANK": local,
                         "DDLKIT_LOCAL_SIZE": self.ppn, "MASTER_ADDR": master, "MASTER_PORT": port,
                         "DDLKIT_CONTROL_ADDR": f"{master}:{port + 1}"}
            pids.append(actor.start.remote(python, args, {k: str(v) for k, v in variables.items()}))
        ray.get(pids)
        nodes = sorted({(rank // self.ppn, places[rank][1][:8]) for rank in range(self.world)})
        say(f"{self.world} rank(s) started on node(s) " + ", ".join(f"{i} ({nid})" for i, nid in nodes)
            + f"; rendezvous {master}:{port}")

    def sync(self, ranks: list[int]) -> None:
        """Copy what the ranks wrote since the last look into the driver's directory (rank 0 last:
        its files win)."""
        import ray

        for rank in sorted(ranks, reverse=True):
            if rank in self.lost:
                continue
            try:
                data = ray.get(self.actors[rank].changes.remote(), timeout=120)
            except Exception as exc:  # noqa: BLE001 -- a lost node's files are lost with it
                self._lose(rank, exc)
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar.getmembers():
                    if member.isfile() and not member.name.startswith(("/", "..")) and "/../" not in member.name:
                        target = self.collected / member.name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        source = tar.extractfile(member)
                        assert source is not None
                        tmp = target.with_name(target.name + ".partial")
                        with open(tmp, "wb") as f:
                            shutil.copyfileobj(source, f)
                        os.replace(tmp, target)

    def _lose(self, rank: int, exc: BaseException) -> None:
        if rank not in self.lost:
            node = rank // self.ppn
            self.lost[rank] = f"rank {rank}'s node ({node}) was lost: {type(exc).__name__}"
            if rank < len(self.node_ids):
                self.lost_nodes.add(self.node_ids[rank])
            say(self.lost[rank])

    def run(self) -> int:
        import ray

        pg = self.place()
        if pg is None:
            return EXIT_PREEMPTED
        self.start(pg)
        codes: dict[int, int] = {}
        first_failure: tuple[int, int] | None = None
        stopping_since: float | None = None
        last_sync = time.monotonic()
        sync_every = float(self.plan["sync_interval_s"])
        grace = float(self.plan["grace_period_s"])
        while len(codes) < self.world:
            if self.stop_requested.is_set() and stopping_since is None:
                say("stop requested: the ranks checkpoint and stop "
                    f"(at most compute.grace_period_s={grace:g} s)")
                self._stop_all(codes)
                stopping_since = time.monotonic()
            for rank, actor in enumerate(self.actors):
                if rank in codes:
                    continue
                try:
                    out, err, code = ray.get(actor.poll.remote(), timeout=30)
                except Exception as exc:  # noqa: BLE001 -- the actor died with its node
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
                    if code != 0 and first_failure is None:
                        first_failure = (rank, code)
                        if len(codes) < self.world and not self.stop_requested.is_set():
                            say(f"rank {rank} ended with exit status {code}: stopping the other ranks")
                            self._stop_all(codes)
                            stopping_since = time.monotonic()
            if stopping_since is not None and time.monotonic() - stopping_since > grace + 5:
                say(f"rank(s) {sorted(set(range(self.world)) - set(codes))} did not stop within "
                    f"{grace:g} s: killing them")
                for rank in set(range(self.world)) - set(codes):
                    ray.kill(self.actors[rank])
                    codes[rank] = 128 + signal.SIGKILL
            if time.monotonic() - last_sync > sync_every:
                self.sync([0])
                last_sync = time.monotonic()
            time.sleep(_PACE_S)
        self.sync(list(range(self.world)))
        for rank, actor in enumerate(self.actors):
            if rank not in self.lost:
                try:
                    ray.get(actor.cleanup.remote(), timeout=30)
                except Exception:  # noqa: BLE001 -- nothing to clean on a lost node
                    pass
        if self.lost:
            return EXIT_NODE_LOST
        if self.stop_requested.is_set():
            return codes.get(0, EXIT_PREEMPTED) or EXIT_PREEMPTED
        return 0 if first_failure is None else first_failure[1]

    def _stop_all(self, codes: dict[int, int]) -> None:
        for rank, actor in enumerate(self.actors):
            if rank not in codes and rank not in self.lost:
                actor.stop.remote()

    # ------------------------------------------------------------ the end
    def publish(self, code: int, why: str) -> None:
        """The ranks' files and the exit record, where Ray's log API serves them to the launcher."""
        import ray

        record = {"submission_id": self.sid, "code": code, "why": why, "lost": sorted(self.lost.values()),
                  "lost_nodes": sorted(self.lost_nodes),
                  "time": time.time()}
        (self.collected / STATE_DIR).mkdir(exist_ok=True)
        (self.collected / EXIT_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")
        logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())  # noqa: SLF001 -- no public API
        target = logs / PUBLISH_DIR / self.sid
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / "files.tar.partial"
        with tarfile.open(tmp, "w") as tar:
            tar.add(self.collected, arcname=".")
        os.replace(tmp, target / "files.tar")
        # last: its presence says the archive is complete
        (target / "exit.json.partial").write_text(json.dumps(record) + "\n", encoding="utf-8")
        os.replace(target / "exit.json.partial", target / "exit.json")
        shutil.rmtree(self.collected, ignore_errors=True)


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
    driver = Driver(plan)
    import ray

    ray.init(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True)
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
