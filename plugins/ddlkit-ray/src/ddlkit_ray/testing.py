"""A real Ray cluster of several simulated nodes on this machine, for tests and benchmarks:
a head and worker raylets started by ``ray start --block`` (Ray's own command line, as a user
starts a cluster), each node's processes in a session of their own, so that one node can be
killed (:meth:`LocalRayCluster.kill_node`: its raylet gets SIGKILL, as a lost machine) and the
whole cluster stopped without touching any other Ray on the machine. Loopback only.

    with LocalRayCluster(nodes=2, cpus_per_node=1) as cluster:
        ... compute.address={cluster.address} ...   # the Ray Jobs endpoint, http://127.0.0.1:<port>

:class:`CountingProxy` counts what a client asks of the cluster's dashboard.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    # a port of the kernel's (port 0) for the cluster's own components: ddlkit.compute.ports.free_ports
    # picks rendezvous ports from 20000 up, and the raylets' worker ports stay below that (see _ports)
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
    #: Ray's token authentication: the cluster's token (every request must carry it), or None for a
    #: cluster without it -- either way whatever ``~/.ray/auth_token`` this machine has (any local
    #: ``ray.init()`` writes one, and ``ray start`` then turns token authentication on) plays no part
    token: str | None = None

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
        return [
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            # below the ephemeral range (32768-) the ports above come from, and below the range
            # (20000-) ddlkit.compute.ports picks rendezvous ports from; apart per node (up to 4)
            # and per cluster
            f"--min-worker-port={(base := 11000 + os.getpid() % 10 * 800 + 200 * len(self._nodes))}",
            f"--max-worker-port={base + 199}",
        ]

    def add_node(self) -> None:
        """One more worker node (a machine joining the cluster)."""
        self._start_node(head=False)
        self.wait_for_nodes(self.alive_nodes)

    def _start_node(self, *, head: bool) -> None:
        index = len(self._nodes)
        args = [
            *_ray_cli(),
            "start",
            "--block",
            f"--num-cpus={self.cpus_per_node}",
            "--num-gpus=0",
            "--object-store-memory=80000000",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            *self._ports(),
        ]
        if head:
            args += [
                "--head",
                f"--port={self.gcs_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--temp-dir={self.temp_dir}",
                f"--ray-client-server-port={free_port()}",
                "--include-dashboard=true",
            ]
        else:
            # a temporary directory of its own, as a machine has: Ray unpacks a job's working_dir below
            # it, and a raylet that finds a package it did not unpack itself deletes and unpacks it
            # again -- under the feet of another simulated node's ranks, whose working directory it is
            args += [f"--address={self.gcs_address}", f"--temp-dir={self.temp_dir / f'n{index}'}"]
        log = self.temp_dir / f"node-{index}.out"
        env = {k: v for k, v in self.env.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
        env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", **self._auth_env())
        with open(log, "ab") as out:
            process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        self._nodes.append(_Node(process, log))
        if head:
            self._wait_for_dashboard()

    def _auth_env(self) -> dict[str, str]:
        """The nodes' side of token authentication: the token in a file only its owner reads (as
        ``~/.ray/auth_token`` is on a real head), or token authentication off."""
        if self.token is None:
            return {"RAY_AUTH_MODE": "disabled"}
        path = self.temp_dir / "auth_token"
        path.touch(mode=0o600)
        path.write_text(self.token)
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}

    @property
    def headers(self) -> dict[str, str]:
        """What a request to the dashboard carries: the token, where the cluster has one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}

    def _wait_for_dashboard(self) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._nodes[0].process.poll() is not None:
                raise RuntimeError(f"ray start --head ended: {self._nodes[0].log.read_text()[-2000:]}")
            request = urllib.request.Request(f"{self.address}/api/version", headers=self.headers)
            try:
                with urllib.request.urlopen(request, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403):  # waiting would not change it
                    raise RuntimeError(f"the Ray dashboard at {self.address} refused the test kit: {exc}") from None
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Ray dashboard did not answer at {self.address} within {self.start_timeout_s:.0f} s")

    @property
    def alive_nodes(self) -> int:
        return sum(node.alive for node in self._nodes)

    def node_ids(self) -> list[str]:
        """The Ray node ids of the live nodes, the head first (as Ray's state API reports them)."""
        from .target import alive_nodes

        nodes = alive_nodes(self.address, self.headers, timeout=10)
        return [n.node_id for n in sorted(nodes, key=lambda n: not n.is_head_node)]

    def wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._nodes[0].process.poll() is not None:
                break
            last = self._nodes[-1]
            if last.alive and last.process.poll() is not None and len(self._nodes) > 1:
                # the newest worker gave up starting: once more
                self._nodes.pop()
                self._start_node(head=False)
            try:
                if len(self.node_ids()) == count:
                    return
            except Exception:  # the state API answers once the head is ready
                pass
            time.sleep(0.5)
        ended = [
            f"node {i}: {n.log.read_text(errors='replace')[-1000:]}"
            for i, n in enumerate(self._nodes)
            if n.alive and n.process.poll() is not None
        ]
        raise RuntimeError(
            f"the local Ray cluster did not have {count} live nodes within {self.start_timeout_s:.0f} s"
            + ("; " + "; ".join(ended) if ended else "")
        )

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


# ---------------------------------------------------------------------------- counting requests
#: headers that belong to one connection, not to the message (RFC 9110 7.6.1), and the length, set anew
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
}


class CountingProxy:
    """A counting HTTP reverse proxy on 127.0.0.1: put in front of a Ray dashboard (the Jobs API,
    the state and log APIs), it forwards every request as it is and keeps the time, method and path
    of each, so that a client pointed at it (``compute.address=<proxy>``) can be counted without
    touching the client. A websocket (the Jobs API's log stream, ``/api/jobs/<id>/logs/tail``) is
    one request: its upgrade is passed on and the two connections are joined byte for byte until
    either side closes.

        with CountingProxy("http://127.0.0.1:8265") as proxy:
            ... compute.address={proxy.address} ...
            proxy.requests   # [(time.time(), "GET", "/api/jobs/<id>"), ...]

    Plain HTTP; each other response is read whole from the dashboard and sent on with its length.
    ``websockets=False``: a proxy that passes no websocket (the upgrade goes on as a plain request,
    which the dashboard refuses). :meth:`fail` answers requests for a path itself, as a dashboard
    whose node agents do not answer does."""

    def __init__(self, upstream: str, *, websockets: bool = True) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.requests: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._failing: dict[str, int] = {}  # path -> how many more requests for it fail (see fail())
        self._tunnels: set[socket.socket] = set()  # the websockets' client sides, open now
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                with proxy._lock:
                    proxy.requests.append((time.time(), self.command, self.path))
                    path = self.path.split("?")[0]
                    failing = proxy._failing.get(path, 0)
                    if failing:
                        proxy._failing[path] = failing - 1
                if failing:
                    self._refuse()
                    return
                if websockets and self.headers.get("Upgrade", "").lower() == "websocket":
                    self._tunnel()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != "host"}
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=600)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _refuse(self) -> None:
                # what the dashboard answers when a node's agent does not (DataSourceUnavailable)
                data = b"Failed to query the data source. It is either there's a network issue, or the source is down."
                if length := int(self.headers.get("Content-Length") or 0):
                    self.rfile.read(length)
                self.send_response(500, "Internal Server Error")
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _tunnel(self) -> None:
                """The upgrade request as it came, then both ways raw until one side closes (the
                client sends nothing more before the dashboard's answer: nothing waits in rfile)."""
                self.close_connection = True
                upstream = socket.create_connection((proxy.upstream_host, proxy.upstream_port))
                head = [f"{self.command} {self.path} HTTP/1.1"] + [
                    f"{k}: {v}" for k, v in self.headers.items() if k.lower() != "host"
                ]
                head.append(f"Host: {proxy.upstream_host}:{proxy.upstream_port}")
                upstream.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))

                def pump(source: socket.socket, sink: socket.socket) -> None:
                    try:
                        while data := source.recv(65536):
                            sink.sendall(data)
                    except OSError:
                        pass
                    finally:  # one side closed: close both, which ends the other pump too
                        for s in (source, sink):
                            try:
                                s.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass

                with proxy._lock:
                    proxy._tunnels.add(self.connection)
                back = threading.Thread(target=pump, args=(upstream, self.connection), daemon=True)
                back.start()
                pump(self.connection, upstream)
                back.join()
                upstream.close()
                with proxy._lock:
                    proxy._tunnels.discard(self.connection)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def drop_websockets(self) -> int:
        """Cut the open websockets as a network that fails would (no close frame); how many."""
        with self._lock:
            tunnels = list(self._tunnels)
        for connection in tunnels:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        return len(tunnels)

    def fail(self, path: str, times: int) -> None:
        """Answer the next ``times`` requests for ``path`` (query aside) with the dashboard's 500 for
        a node agent that does not answer, instead of passing them on (0: pass them on again)."""
        with self._lock:
            self._failing[path] = times

    def between(self, start: float, end: float) -> list[tuple[float, str, str]]:
        with self._lock:
            return [r for r in self.requests if start <= r[0] <= end]
