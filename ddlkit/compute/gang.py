"""The schema base of a compute target whose job is a gang: ``nodes`` nodes of ``procs_per_node`` ranks
each, all started together, ``nodes x procs_per_node`` ranks in all.

A target's schema extends :class:`GangConfig` (or :class:`ElasticGangConfig`, whose jobs may go on with
fewer nodes after losing some) and adds its own options; a field whose default differs on that target
is declared again with its default, and with a comment of its own where its words differ::

    from ddlkit.compute.gang import ElasticGangConfig
    from ddlkit.options import POSITIVE, POSITIVE_INTEGER, checked

    @dataclass
    class MyClusterConfig(ElasticGangConfig):
        procs_per_node: int = checked(4, POSITIVE_INTEGER)
        # seconds between looks at the job
        poll_interval_s: float = checked(5.0, POSITIVE)

The target's :attr:`ddlkit.ComputeTarget.world_size`, :attr:`~ddlkit.ComputeTarget.nodes` and
:attr:`~ddlkit.ComputeTarget.min_nodes` then come from these fields: the target writes none of them.
The rules on the fields are :mod:`ddlkit.options` rules, checked with the rest of the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..options import POSITIVE_INTEGER, checked

__all__ = ["ElasticGangConfig", "GangConfig", "is_gang", "world_size"]


@dataclass
class GangConfig:
    """``compute.nodes`` nodes of ``compute.procs_per_node`` ranks each."""

    # nodes of the job; it has nodes x procs_per_node ranks
    nodes: int = checked(1, POSITIVE_INTEGER)
    # ranks per node (on a GPU cluster: GPUs per node)
    procs_per_node: int = checked(1, POSITIVE_INTEGER)

    @property
    def world_size(self) -> int:
        """The job's ranks: ``nodes x procs_per_node``."""
        return world_size(self)


@dataclass
class ElasticGangConfig(GangConfig):
    """A gang that may go on with fewer nodes after losing some (``compute.min_nodes``)."""

    # elastic world size: the fewest nodes a job restarted after losing a node goes on with (null:
    # compute.nodes, not elastic); with fewer up, the restart waits for capacity (restart.capacity_wait_s)
    min_nodes: int | None = checked(None, POSITIVE_INTEGER)


def is_gang(cfg: Any, *, elastic: bool = False) -> bool:
    """Whether ``cfg`` -- a target's config: its schema's instance, or the typed node OmegaConf made
    of it (what a target is built from) -- is a :class:`GangConfig`; with ``elastic``, an
    :class:`ElasticGangConfig`."""
    schema = OmegaConf.get_type(cfg) if isinstance(cfg, DictConfig) else type(cfg)
    return isinstance(schema, type) and issubclass(schema, ElasticGangConfig if elastic else GangConfig)


def world_size(cfg: Any) -> int:
    """The ranks of a job of the gang ``cfg`` (a :class:`GangConfig` or its typed node): ``nodes x
    procs_per_node``. A typed node has no properties: hence this function beside :attr:`GangConfig.world_size`."""
    return int(cfg.nodes) * int(cfg.procs_per_node)
