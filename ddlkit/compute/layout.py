"""A rank's place in its job, as every compute target writes it into each rank's environment: the
one owner of those variables' names and of the control plane's port.

::

    layout = RankLayout(rank=5, world_size=8, local_rank=1, local_size=4, node=1,
                        master_addr="node-0", master_port=29500)
    env |= layout.to_env()   # RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (torchrun's),
                             # DDLKIT_NODE, DDLKIT_LOCAL_RANK, DDLKIT_LOCAL_SIZE (ddlkit's node layout),
                             # MASTER_ADDR, MASTER_PORT, DDLKIT_CONTROL_ADDR (node-0:29501)

A target whose ranks learn their place in a script (a batch job's shell, Azure ML's command) spells
the same names from the constants here, and the control port as :data:`CONTROL_PORT_SHELL`. The
rank reads them back in :class:`ddlkit.DistContext`, where ddlkit's node layout wins over what
OpenMPI or torchrun say of the host (``compute=local_mpi`` simulates several nodes on one).

Standard library only: the rank entries import it before the worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONTROL_ADDR_ENV",
    "CONTROL_PORT_SHELL",
    "LAYOUT_VARIABLES",
    "LOCAL_RANK_ENV",
    "LOCAL_SIZE_ENV",
    "NODE_ENV",
    "NODE_SCRATCH_ENV",
    "RankLayout",
    "control_port",
]

#: ddlkit's node layout: which (possibly simulated) node a rank runs on, its rank on that node, and
#: how many ranks the node has; they win over the MPI/torchrun values
NODE_ENV, LOCAL_RANK_ENV, LOCAL_SIZE_ENV = "DDLKIT_NODE", "DDLKIT_LOCAL_RANK", "DDLKIT_LOCAL_SIZE"
#: the node's local scratch directory ("local SSD"), where the target provides one
NODE_SCRATCH_ENV = "DDLKIT_NODE_SCRATCH"
#: what every target gives its ranks (the rank minder refuses to start a rank without them)
LAYOUT_VARIABLES = (NODE_ENV, LOCAL_RANK_ENV, LOCAL_SIZE_ENV)
#: ``host:port`` where rank 0's control plane listens (ddlkit.rank.control_plane)
CONTROL_ADDR_ENV = "DDLKIT_CONTROL_ADDR"
#: :func:`control_port` in a shell script that has ``MASTER_PORT`` set
CONTROL_PORT_SHELL = "$((MASTER_PORT + 1))"


def control_port(master_port: int) -> int:
    """The control plane's port: the one after the framework's rendezvous port (``MASTER_PORT``)."""
    return int(master_port) + 1


@dataclass(frozen=True)
class RankLayout:
    """One rank's place: its rank and the job's size, its node and its rank there, and (where the
    target knows it) rank 0's rendezvous address."""

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    node: int
    master_addr: str | None = None
    master_port: int | None = None

    def to_env(self) -> dict[str, str]:
        """The rank's variables: torchrun's names, ddlkit's node layout, and the rendezvous."""
        env: dict[str, object] = {
            "RANK": self.rank,
            "WORLD_SIZE": self.world_size,
            "LOCAL_RANK": self.local_rank,
            "LOCAL_WORLD_SIZE": self.local_size,
            "GROUP_RANK": self.node,
            NODE_ENV: self.node,
            LOCAL_RANK_ENV: self.local_rank,
            LOCAL_SIZE_ENV: self.local_size,
        }
        if self.master_addr is not None and self.master_port is not None:
            env |= {
                "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": self.master_port,
                CONTROL_ADDR_ENV: f"{self.master_addr}:{control_port(self.master_port)}",
            }
        return {key: str(value) for key, value in env.items()}

    @classmethod
    def variables(cls) -> tuple[str, ...]:
        """Every name :meth:`to_env` may write."""
        return tuple(cls(0, 1, 0, 1, 0, "", 0).to_env())
