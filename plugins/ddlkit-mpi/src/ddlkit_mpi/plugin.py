"""Registers ``compute=local_mpi`` and ``compute=mpi``. Hook implementations only: nothing heavy at import."""

from __future__ import annotations

import ddlkit


@ddlkit.hookimpl
def ddlkit_compute_targets():
    yield ddlkit.Registration(
        "local_mpi",
        "ddlkit_mpi.target:LocalMpiTarget",
        config="ddlkit_mpi.target:LocalMpiConfig",
        description="nodes x procs_per_node ranks on this machine, via OpenMPI's mpirun, "
        "each simulated node with its own scratch directory",
    )
    yield ddlkit.Registration(
        "mpi",
        "ddlkit_mpi.target:MpiTarget",
        config="ddlkit_mpi.target:MpiConfig",
        description="one job across real hosts via OpenMPI's mpirun: compute.hosts, "
        "compute.hostfile, or the cluster scheduler's allocation",
    )
