"""One view of the process group for every framework plugin: rank, size, node, collectives.

A rank learns its place from the environment its launcher set: OpenMPI (``OMPI_COMM_WORLD_*``),
torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``) or none (a single process). Framework plugins
do their gradient all-reduce with their own collectives; this context is for the framework-
neutral part: who logs, who writes checkpoints, which node-local duties fall to whom.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    #: index of the (possibly simulated) node this rank runs on
    node: int = 0
    #: "none", "native" or "horovod"
    backend: str = "none"

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that logs, checkpoints and writes result.json."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """Local rank 0: does per-node duties such as staging data to the node's disk."""
        return self.local_rank == 0

    def allreduce_mean(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Average scalar metrics over ranks (identity for a single process)."""
        if self.world_size != 1:
            raise NotImplementedError(f"dist.backend={self.backend} collectives are not available yet")
        return dict(metrics)

    def barrier(self) -> None:
        if self.world_size != 1:
            raise NotImplementedError(f"dist.backend={self.backend} collectives are not available yet")

    @classmethod
    def from_env(cls, backend: str = "none", env: Mapping[str, str] | None = None) -> DistContext:
        env = os.environ if env is None else env

        def pick(*names: str, default: int) -> int:
            for n in names:
                if env.get(n, "") != "":
                    return int(env[n])
            return default

        rank = pick("OMPI_COMM_WORLD_RANK", "RANK", default=0)
        world = pick("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
        local_rank = pick("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", default=0)
        local_size = pick("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=1)
        node = pick("DDLKIT_NODE", "OMPI_COMM_WORLD_NODE_RANK", "GROUP_RANK", default=rank // max(local_size, 1))
        return cls(rank, world, local_rank, local_size, node, backend)
