"""What ``mpirun`` starts for every rank: ``python -m ddlkit_mpi.rank [options] -- COMMAND...``,
in the job directory (``--job-dir .``: mpirun's working directory, which OpenMPI gives every rank,
on every host).

It runs COMMAND (the ddlkit worker) under ddlkit's rank minder
(:mod:`ddlkit.compute.rank_minder`: ``rank-N.log``, rank 0's output and the other ranks' error
lines on mpirun's console, the exit record ``.ranks/rank-N.json`` from which the launcher names the
rank that failed first, signals -- SIGUSR1 is how mpirun cancels a multi-host job --, no
orphans). What is MPI's own:

* **node layout**, one of two modes:

  - simulated (``compute=local_mpi``, ``--procs-per-node P``): ranks are placed node by node, so
    rank ``r`` is local rank ``r % P`` on simulated node ``r // P`` of this one machine (or on the
    ``r // P``-th of ``--node-ids``: a job restarted on the nodes that were not lost);
  - real hosts (``compute=mpi``, ``--node-sizes 4,4,...``: the ranks mpirun places on each host,
    in order): local rank and local size are OpenMPI's own (``OMPI_COMM_WORLD_LOCAL_RANK``,
    ``OMPI_COMM_WORLD_LOCAL_SIZE``); OpenMPI exports no node index, so the node is the host whose
    block of ranks (``--map-by slot`` fills host after host) begins with this host's first rank;

  the child gets ``DDLKIT_NODE``, ``DDLKIT_LOCAL_RANK``, ``DDLKIT_LOCAL_SIZE`` and
  ``DDLKIT_NODE_SCRATCH`` (``<scratch>/node-K``, created here, on the node's own disk when
  ``--scratch`` is local to it); the rank is OpenMPI's ``OMPI_COMM_WORLD_RANK``;
* **the job directory**: a rank that OpenMPI started elsewhere (a host where mpirun's directory
  does not exist) refuses to start, saying so;
* **cancel marker** (``--cancel-file``): a rank that starts after the job was cancelled stops at once.

Standard library, :mod:`ddlkit.compute.rank_minder` and :mod:`~ddlkit.compute.layout` only: it starts once per
rank before the worker.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ddlkit.compute import rank_minder as minder
from ddlkit.compute.layout import LOCAL_RANK_ENV, LOCAL_SIZE_ENV, NODE_ENV, NODE_SCRATCH_ENV


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


def layout(rank: int, args: argparse.Namespace, env: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """The variables rank ``rank`` gets: its node layout (simulated or OpenMPI's), and its node's
    scratch directory, created here."""
    if args.procs_per_node is not None:
        node, local_rank = node_layout(rank, args.procs_per_node)
        local_size = args.procs_per_node
        if args.node_ids:
            node = args.node_ids[node]  # a job restarted on fewer simulated nodes: which ones they are
    else:
        local_rank = int(env["OMPI_COMM_WORLD_LOCAL_RANK"])
        local_size = int(env["OMPI_COMM_WORLD_LOCAL_SIZE"])
        node = host_node(rank, local_rank, local_size, args.node_sizes)
    base = Path(os.path.expanduser(os.path.expandvars(args.scratch)))
    scratch = (base if base.is_absolute() else Path.cwd() / base) / f"node-{node}"
    scratch.mkdir(parents=True, exist_ok=True)
    return {
        NODE_ENV: str(node),
        LOCAL_RANK_ENV: str(local_rank),
        LOCAL_SIZE_ENV: str(local_size),
        NODE_SCRATCH_ENV: str(scratch),
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddlkit_mpi.rank")
    parser.add_argument("--job-dir", type=Path, default=Path("."))
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--procs-per-node", type=int, help="simulated nodes of this many ranks each, on this machine")
    group.add_argument(
        "--node-sizes",
        type=lambda s: [int(n) for n in s.split(",")],
        help="real hosts: the ranks mpirun places on each host, in order (e.g. 4,4)",
    )
    parser.add_argument(
        "--node-ids",
        type=lambda s: [int(n) for n in s.split(",")],
        help="simulated nodes: which nodes the job runs on, in order (default 0,1,...): a job "
        "restarted on the nodes that were not lost",
    )
    parser.add_argument(
        "--scratch",
        default="nodes",
        help="base of the nodes' scratch directories ($VARS and ~ expanded on the node; "
        "relative: to the job directory)",
    )
    parser.add_argument(
        "--cancel-file",
        help="the job's cancel marker (relative: to the job directory): a rank "
        "that starts after it was written stops at once",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    minder.forward_signals()  # first of all: a stop request while this rank starts must not kill it
    args = _parse(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("python -m ddlkit_mpi.rank: no command after --", file=sys.stderr)
        return 2

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    wanted = os.environ.get("OMPI_MCA_initial_wdir")
    if wanted and os.path.realpath(wanted) != os.path.realpath(os.getcwd()):
        # OpenMPI falls back to the home directory on a host where mpirun's directory is missing
        print(
            f"[rank {rank}] error: the job directory {wanted} does not exist on host {os.uname().nodename}: "
            "compute=mpi needs the job directory on a file system every host mounts at the same path",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return minder.run(
        command,
        rank=rank,
        variables=layout(rank, args, os.environ),
        name="ddlkit_mpi",
        job_dir=str(args.job_dir),
        cancel_file=args.cancel_file,
    )


if __name__ == "__main__":
    sys.exit(main())
