"""Where an elastic job restarts (``compute.min_nodes`` below ``compute.nodes``): on the nodes its
target has now, at least ``min_nodes`` and at most ``nodes`` -- fewer after it lost some that did
not come back, all of them again once they have. The target tells (:meth:`ComputeTarget.nodes_up`)
and builds itself for that many (:meth:`ComputeTarget.with_nodes`); the launcher decides here, the
same way for every target, and says what the new world size does to the batch and the learning
rate (``trainer.on_resize``, :mod:`ddlkit.resize`) on the console and in the job's record. The ranks
apply it themselves (they learn the planned world size from ``DDLKIT_PLANNED_WORLD_SIZE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TextIO

from omegaconf import OmegaConf

from ..errors import ConfigError
from ..interfaces import ComputeTarget, JobSpec
from ..resize import PLANNED_WORLD_SIZE_ENV, describe, plan_batch


@dataclass(frozen=True)
class Placement:
    """The target a restart runs on, and what the job's record keeps of the choice."""

    target: ComputeTarget
    #: for the restart's entry in the job's record (empty for a job that is not elastic)
    entry: dict[str, Any] = field(default_factory=dict)
    #: the ranks' environment besides the job's own
    env: dict[str, str] = field(default_factory=dict)


def is_elastic(target: ComputeTarget) -> bool:
    return target.min_nodes < target.nodes


def check(target: ComputeTarget, config: dict[str, Any]) -> None:
    """Before an elastic job starts: ``compute.min_nodes`` makes sense, and ``trainer.on_resize=
    keep_global_batch`` can keep the global batch on every world size the job may shrink to."""
    if not is_elastic(target):
        return
    per_node = target.world_size // target.nodes
    trainer = OmegaConf.create(config["trainer"])
    for nodes in range(target.min_nodes, target.nodes):
        try:
            plan_batch(trainer, target.world_size, nodes * per_node)
        except ConfigError as err:
            raise ConfigError(f"compute.min_nodes={target.min_nodes}: on {nodes} node(s) of {per_node} rank(s), "
                              f"{err}") from None


def place_restart(planned: ComputeTarget, current: ComputeTarget, spec: JobSpec, config: dict[str, Any], *,
                  restart: str, out: TextIO, prefix: str = "ddlkit: ") -> Placement | str:
    """The target the job restarts on (``planned``: as submitted first; ``current``: its last run's),
    or why it cannot restart (fewer nodes up than ``compute.min_nodes``). ``restart``: "1/3";
    ``prefix`` names the job in the line said (a sweep's job number)."""
    if not is_elastic(planned):
        return Placement(planned)
    env = {PLANNED_WORLD_SIZE_ENV: str(planned.world_size)}
    up = planned.nodes_up(spec)
    name = config["compute"]["name"]
    if up is None:
        out.write(f"{prefix}restart {restart}: compute={name} cannot tell which nodes are up; restarting on all "
                  f"{planned.nodes}\n")
        out.flush()
        return Placement(planned, {"nodes": planned.nodes, "planned_nodes": planned.nodes}, env)
    nodes = min(up, planned.nodes)
    if nodes < planned.min_nodes:
        return (f"only {up} of its {planned.nodes} nodes are up, fewer than compute.min_nodes={planned.min_nodes}; "
                "it resumes from its checkpoint when run again")
    target = planned if nodes == planned.nodes else planned.with_nodes(nodes, spec)
    trainer, optimizer = OmegaConf.create(config["trainer"]), OmegaConf.create(config["optimizer"])
    before = plan_batch(trainer, planned.world_size, current.world_size)
    after = plan_batch(trainer, planned.world_size, target.world_size)
    what = describe(before, after, optimizer, trainer.on_resize)
    out.write(f"{prefix}restart {restart} on {nodes} of {planned.nodes} nodes (compute.min_nodes="
              f"{planned.min_nodes}, {_ranks(target.world_size)}): {what}\n")
    out.flush()
    return Placement(target, {"nodes": nodes, "planned_nodes": planned.nodes, "world_size": target.world_size,
                              "resize": what}, env)


def _ranks(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")
