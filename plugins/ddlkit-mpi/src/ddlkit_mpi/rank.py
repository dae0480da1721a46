"""What ``mpirun`` starts for every rank: ``python -m ddlkit_mpi.rank [options] -- COMMAND...``,
in the job directory (``--job-dir .``: mpirun's working directory, which OpenMPI gives every rank,
on every host).

It runs COMMAND (the ddlkit worker) as its child and is the rank's minder:

* **node layout**, one of two modes:

  - simulated (``compute=local_mpi``, ``--procs-per-node P``): ranks are placed node by node, so
    rank ``r`` is local rank ``r % P`` on simulated node ``r // P`` of this one machine;
  - real hosts (``compute=mpi``, ``--node-sizes 4,4,...``: the ranks mpirun places on each host,
    in order): local rank and local size are OpenMPI's own (``OMPI_COMM_WORLD_LOCAL_RANK``,
    ``OMPI_COMM_WORLD_LOCAL_SIZE``); OpenMPI exports no node index, so the node is the host whose
    block of ranks (``--map-by slot`` fills host after host) begins with this host's first rank;

  the child gets ``DDLKIT_NODE``, ``DDLKIT_LOCAL_RANK``, ``DDLKIT_LOCAL_SIZE`` and
  ``DDLKIT_NODE_SCRATCH`` (``<scratch>/node-K``, created here, on the node's own disk when
  ``--scratch`` is local to it), which :class:`ddlkit.DistContext` prefers over anything else;
* **logs**: everything the child prints goes to ``rank-N.log`` in the job directory; rank 0's
  output is also passed on to mpirun (the console), other ranks pass on only their error lines,
  prefixed ``[rank N]``;
* **exit record**: when the child ends, ``.ranks/rank-N.json`` says how and when, so the
  launcher can name the rank that failed *first* (mpirun then stops the others, which fail too);
* **signals**: SIGTERM/SIGINT are passed to the child (the worker checkpoints and stops), and so
  is SIGUSR1, as SIGTERM: mpirun forwards SIGUSR1 to every rank on every host, which is how a
  multi-host job is cancelled; the child dies with this process (``PR_SET_PDEATHSIG``), and
  whatever the child left running is killed when it ends, so a rank leaves no orphans.

Standard library only, and nothing from ddlkit: it starts once per rank before the worker.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

#: lines of a non-zero rank's stderr that reach the console
ERROR_LINE = re.compile(rb"\b(error|exception|traceback|fatal|killed|aborted|segmentation fault|out of memory)\b",
                        re.IGNORECASE)
#: and the control plane's word that a rank stopped answering, or answers again (ddlkit.distributed):
#: when rank 0 is the silent one, only the other ranks can say so
LIVENESS_LINE = re.compile(rb"^ddlkit: rank \d+ (has not been heard from|is answering again)")
#: where the exit records go, relative to the job directory
RECORDS_DIR = ".ranks"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it if this minder dies (an MPI abort kills the minder's
    process group, which the child has left so that its own leftovers can be killed apart)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ErrorFilter:
    """Picks a rank's error lines out of its stderr: lines that name an error, whole Python
    tracebacks (up to and including the exception line) and liveness warnings."""

    def __init__(self) -> None:
        self.partial = b""
        self.in_traceback = False

    def feed(self, data: bytes) -> list[bytes]:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        picked = []
        for line in lines:
            if line.startswith(b"Traceback (most recent call last)"):
                self.in_traceback = True
            if self.in_traceback or ERROR_LINE.search(line) or LIVENESS_LINE.match(line):
                picked.append(line)
            if self.in_traceback and line and not line[:1].isspace() and not line.startswith(b"Traceback"):
                self.in_traceback = False  # the exception line ends the traceback
        return picked


def node_layout(rank: int, procs_per_node: int) -> tuple[int, int]:
    """(node, local rank) of ``rank`` when ranks fill the nodes one after the other."""
    return divmod(rank, procs_per_node)


def host_node(rank: int, local_rank: int, local_size: int, node_sizes: list[int]) -> int:
    """The node (index into the hosts) of ``rank``, OpenMPI's local rank ``local_rank`` of
    ``local_size`` on its host, when mpirun placed ``node_sizes[i]`` ranks on host ``i``, host
    after host: the host whose block of ranks begins where this host's ranks begin."""
    first, start = rank - local_rank, 0
    for node, size in enumerate(node_sizes):
        if start == first and size == local_size:
            return node
        start += size
    # not laid out host after host (a --map-by in compute.mpirun_args): equal hosts are the common case
    return rank // max(local_size, 1)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddlkit_mpi.rank")
    parser.add_argument("--job-dir", type=Path, default=Path("."))
    layout = parser.add_mutually_exclusive_group(required=True)
    layout.add_argument("--procs-per-node", type=int, help="simulated nodes of this many ranks each, on this machine")
    layout.add_argument("--node-sizes", type=lambda s: [int(n) for n in s.split(",")],
                        help="real hosts: the ranks mpirun places on each host, in order (e.g. 4,4)")
    parser.add_argument("--scratch", default="nodes",
                        help="base of the nodes' scratch directories ($VARS and ~ expanded on the node; "
                             "relative: to the job directory)")
    parser.add_argument("--cancel-file", help="the job's cancel marker (relative: to the job directory): a rank "
                                              "that starts after it was written stops at once")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


#: the worker, once started (a list, so that the signal handler sees it)
started: list[subprocess.Popen[bytes]] = []
#: signals that arrived before the worker was started: it gets them once it is
pending: list[int] = []


def _forward(signum: int, frame: object) -> None:
    """To the worker only, not its process group: the worker decides how to stop (it checkpoints
    at the next step); its helpers are cleaned up when it has ended. SIGUSR1 is what mpirun
    forwards to the ranks of a cancelled multi-host job: the worker gets SIGTERM."""
    sig = signal.SIGTERM if signum == signal.SIGUSR1 else signum
    if not started:
        pending.append(sig)
        return
    try:
        os.kill(started[0].pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    # first of all: a stop request that comes while this minder starts up must not kill it
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, _forward)
    args = _parse(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("python -m ddlkit_mpi.rank: no command after --", file=sys.stderr)
        return 2

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    wanted = os.environ.get("OMPI_MCA_initial_wdir")
    if wanted and os.path.realpath(wanted) != os.path.realpath(os.getcwd()):
        # OpenMPI falls back to the home directory on a host where mpirun's directory is missing
        print(f"[rank {rank}] error: the job directory {wanted} does not exist on host {os.uname().nodename}: "
              "compute=mpi needs the job directory on a file system every host mounts at the same path",
              file=sys.stderr, flush=True)
        return 1
    if args.procs_per_node is not None:
        node, local_rank = node_layout(rank, args.procs_per_node)
        local_size = args.procs_per_node
    else:
        local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
        local_size = int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
        node = host_node(rank, local_rank, local_size, args.node_sizes)
    base = Path(os.path.expanduser(os.path.expandvars(args.scratch)))
    scratch = (base if base.is_absolute() else Path.cwd() / base) / f"node-{node}"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DDLKIT_NODE": str(node), "DDLKIT_LOCAL_RANK": str(local_rank),
           "DDLKIT_LOCAL_SIZE": str(local_size), "DDLKIT_NODE_SCRATCH": str(scratch)}
    log_path = args.job_dir / f"rank-{rank}.log"
    parent = os.getppid()

    if args.cancel_file and os.path.exists(args.cancel_file):
        # the job was cancelled before this rank started: the stop signal may have missed it
        pending.append(signal.SIGTERM)
    started.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, env=env, process_group=0, preexec_fn=_die_with_parent))
    child = started[0]
    for sig in pending:
        os.kill(child.pid, sig)

    errors = ErrorFilter()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    sel = selectors.DefaultSelector()
    assert child.stdout is not None and child.stderr is not None
    sel.register(child.stdout, selectors.EVENT_READ, "stdout")
    sel.register(child.stderr, selectors.EVENT_READ, "stderr")
    ended_at: float | None = None
    ended_wall: float | None = None
    with open(log_path, "ab") as log:
        # until both pipes close; a helper the child left running may hold them open, so after
        # the child has ended its process group is killed, and the pipes are given a moment
        while sel.get_map() and (ended_at is None or time.monotonic() - ended_at < 2.0):
            for key, _ in sel.select(timeout=0.2):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                log.write(data)
                log.flush()
                if rank == 0:
                    stream = out if key.data == "stdout" else err
                    stream.write(data)
                    stream.flush()
                elif key.data == "stderr":
                    for line in errors.feed(data):
                        err.write(b"[rank %d] %s\n" % (rank, line))
                    err.flush()
            if ended_at is None and child.poll() is not None:
                ended_at, ended_wall = time.monotonic(), time.time()
                _kill_group(child.pid)
            if os.getppid() != parent and child.poll() is None:
                # mpirun is gone (killed): nobody will collect this rank, so end it
                _kill_group(child.pid)
        code = child.wait()
        finished = ended_wall or time.time()
        _kill_group(child.pid)
        if code != 0:
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            log.write(f"[ddlkit_mpi] rank {rank} (node {node}) ended with {how}\n".encode())
            err.write(f"[rank {rank}] ended with {how}\n".encode())
            err.flush()
    _write_record(args.job_dir, {"rank": rank, "node": node, "local_rank": local_rank, "code": code,
                                 "time": finished, "log": str(log_path), "pid": child.pid,
                                 "host": os.uname().nodename})
    # a signal death is reported to mpirun the shell's way (128 + signal), never as success
    return 128 - code if code < 0 else code


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _write_record(job_dir: Path, record: dict) -> None:
    directory = job_dir / RECORDS_DIR
    directory.mkdir(exist_ok=True)
    path = directory / f"rank-{record['rank']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)  # the launcher never reads half a record


if __name__ == "__main__":
    sys.exit(main())
