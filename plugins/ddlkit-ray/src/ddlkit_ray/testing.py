"""A real Ray cluster of several simulated nodes on this machine, for tests and benchmarks:
a head and worker raylets started by ``ray start --block`` (Ray's own command line, as a user
starts a cluster), each node's processes in a session of their own, so that one node can be
killed (:meth:`LocalRayCluster.kill_node`: its raylet gets SIGKILL, as a lost machine) and the
whole cluster stopped without touching any other Ray on the machine. Loopback only.

    with LocalRayCluster(nodes=2, cpus_per_node=1) as cluster:
        ... compute.address={cluster.address} ...   # the Ray Jobs endpoint, http://127.0.0.1:<port>
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    # the ray CLI of this interpreter's Ray, whatever is first on PATH
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


@dataclass
class _Node:
    process: subprocess.Popen
    log: Path
    alive: bool = True


@dataclass
class LocalRayCluster:
    #: simulated nodes (the head is the first)
    nodes: int = 2
    #: CPUs each node offers to Ray's scheduler (a rank takes compute.cpus_per_rank of them)
    cpus_per_node: int = 1
    #: seconds to wait for the cluster to have all its nodes
    start_timeout_s: float = 180.0
    #: the environment of the raylets and of every process they start (PYTHONPATH, DDLKIT_PLUGINS, ...)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def __post_init__(self) -> None:
        # short: Ray's Unix sockets live below it (a socket path has at most 107 characters)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self._nodes: list[_Node] = []

    @property
    def address(self) -> str:
        """The Ray Jobs endpoint (the dashboard's HTTP address): what ``compute.address`` takes."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def __enter__(self) -> LocalRayCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start_node(head=True)
            self.wait_for_nodes(1)
            for count in range(2, self.nodes + 1):
                # one at a time: a raylet that has not registered with the GCS within 30 s gives up
                # (Ray's fixed limit), which several starting at once on a busy machine can miss
                self._start_node(head=False)
                self.wait_for_nodes(count)
        except BaseException:
            self.stop()
            raise

    def _ports(self) -> list[str]:
        # every raylet on one machine needs ports of its own (Ray's defaults are fixed numbers)
        return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}",
                # below the ephemeral range (32768-) the ports above come from, apart per node and per cluster
                f"--min-worker-port={(base := 11000 + os.getpid() % 10 * 2000 + 200 * len(self._nodes))}",
                f"--max-worker-port={base + 199}"]

    def add_node(self) -> None:
        """One more worker node (a machine joining the cluster)."""
        self._start_node(head=False)
        self.wait_for_nodes(self.alive_nodes)

    def _start_node(self, *, head: bool) -> None:
        index = len(self._nodes)
        args = [*_ray_cli(), "start", "--block", f"--num-cpus={self.cpus_per_node}", "--num-gpus=0",
                "--object-store-memory=80000000", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                *self._ports()]
        if head:
            args += ["--head", f"--port={self.gcs_port}", "--dashboard-host=127.0.0.1",
                     f"--dashboard-port={self.dashboard_port}", f"--temp-dir={self.temp_dir}",
                     f"--ray-client-server-port={free_port()}",
                     "--include-dashboard=true"]
        else:
            args += [f"--address={self.gcs_address}"]
        log = self.temp_dir / f"node-{index}.out"
        env = {**self.env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        with open(log, "ab") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True)
        self._nodes.append(_Node(process, log))
        if head:
            self._wait_for_dashboard()

    def _wait_for_dashboard(self) -> None:
        import urllib.request

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._nodes[0].process.poll() is not None:
                raise RuntimeError(f"ray start --head ended: {self._nodes[0].log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.address}/api/version", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Ray dashboard did not answer at {self.address} within {self.start_timeout_s:.0f} s")

    @property
    def alive_nodes(self) -> int:
        return sum(node.alive for node in self._nodes)

    def node_ids(self) -> list[str]:
        """The Ray node ids of the live nodes, the head first (as Ray's state API reports them)."""
        from ray.util.state import list_nodes

        nodes = [n for n in list_nodes(address=self.address, timeout=10) if n.state == "ALIVE"]
        return [n.node_id for n in sorted(nodes, key=lambda n: not n.is_head_node)]

    def wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not self._nodes[0].process.poll() is None:
                break
            last = self._nodes[-1]
            if last.alive and last.process.poll() is not None and len(self._nodes) > 1:
                # the newest worker gave up starting: once more
                self._nodes.pop()
                self._start_node(head=False)
            try:
                if len(self.node_ids()) == count:
                    return
            except Exception:  # noqa: BLE001 -- the state API answers once the head is ready
                pass
            time.sleep(0.5)
        ended = [f"node {i}: {n.log.read_text(errors='replace')[-1000:]}" for i, n in enumerate(self._nodes)
                 if n.alive and n.process.poll() is not None]
        raise RuntimeError(f"the local Ray cluster did not have {count} live nodes within {self.start_timeout_s:.0f} s"
                           + ("; " + "; ".join(ended) if ended else ""))

    def _raylets(self) -> dict[str, tuple[int, int]]:
        """Node id -> (index in start order, raylet pid), for this cluster's live raylets."""
        sessions = {node.process.pid: i for i, node in enumerate(self._nodes)}  # start_new_session: sid == pid
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            sid = int(stat.rsplit(")", 1)[1].split()[3])
            if sid in sessions and argv[0].endswith(b"/raylet"):
                node_id = next((a.split(b"=", 1)[1].decode() for a in argv if a.startswith(b"--node_id=")), "")
                found[node_id] = (sessions[sid], int(entry.name))
        return found

    def head_node_id(self) -> str:
        return next(nid for nid, (index, _) in self._raylets().items() if index == 0)

    def kill_node(self, node_id: str) -> None:
        """The node whose Ray node id starts with ``node_id`` is lost: its raylet gets SIGKILL
        (``ray start --block`` then ends that node's other processes); the rank processes on it
        die with their Ray workers."""
        matches = [(nid, where) for nid, where in self._raylets().items() if nid.startswith(node_id)]
        if len(matches) != 1:
            raise LookupError(f"no single live node of this cluster has an id starting {node_id!r}")
        index, pid = matches[0][1]
        if index == 0:
            raise ValueError("that is the head node: without it (the GCS) there is no cluster left to survive in")
        os.kill(pid, signal.SIGKILL)
        self._nodes[index].alive = False

    def stop(self) -> None:
        for node in reversed(self._nodes):
            _stop_session(node.process)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _stop_session(process: subprocess.Popen) -> None:
    """SIGTERM to ``ray start`` (it stops its node's processes), then SIGKILL to whatever of the
    node's session is left: Ray puts some of its processes in process groups of their own."""
    from ddlkit.compute.process import kill_session

    try:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    kill_session(process.pid, signal.SIGKILL)  # start_new_session: the session id is its pid
    process.wait()
