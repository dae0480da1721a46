"""Where an elastic job restarts (``compute.min_nodes`` below ``compute.nodes``): on the nodes its
target has now, at least ``min_nodes`` and at most ``nodes`` -- fewer after it lost some that did
not come back, all of them again once they have. The target tells (:meth:`ComputeTarget.nodes_up`)
and builds itself for that many (:meth:`ComputeTarget.with_nodes`); the launcher decides here, the
same way for every target, and says what the new world size does to the batch and the learning
rate (``trainer.on_resize``, :mod:`ddlkit.resize`) on the console and in the job's record. The ranks
apply it themselves (they learn the planned world size from ``DDLKIT_PLANNED_WORLD_SIZE``).

Any restart -- elastic or not -- needs ``compute.min_nodes`` (null: ``compute.nodes``) of the job's
nodes up, as far as its target can tell. With fewer, it **waits for capacity**
(:class:`CapacityWait`): it asks the target again at its poll interval, saying on the console how
many nodes are up against how many it needs and how long it waits, for up to
``restart.capacity_wait_s`` (null: the target's ``default_capacity_wait_s``); once enough nodes are
up the restart goes on, and when the wait is over the job fails, naming what it waited for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from omegaconf import OmegaConf

from ..errors import ConfigError
from ..interfaces import ComputeTarget, JobSpec
from ..resize import PLANNED_WORLD_SIZE_ENV, describe, plan_batch

#: the shortest pace of the looks for capacity: a cluster's nodes come and go in seconds, and a local
#: target's 0.05 s pace (made for its processes' ends) would only keep a scheduler's API busy
MIN_CAPACITY_POLL_S = 1.0
#: while a restart waits for capacity, it says so again at least this often (and whenever the count changes)
CAPACITY_NOTICE_S = 60.0


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
            raise ConfigError(
                f"compute.min_nodes={target.min_nodes}: on {nodes} node(s) of {per_node} rank(s), {err}"
            ) from None


@dataclass(frozen=True)
class Shortfall:
    """Fewer of the job's nodes up than its restart needs (``compute.min_nodes``, null: ``compute.nodes``)."""

    up: int
    needed: int
    nodes: int
    #: the compute target's name (``compute=ray``)
    compute: str
    #: whether ``compute.min_nodes`` is set (a job without it needs all its nodes)
    min_nodes_set: bool

    @property
    def wanted(self) -> str:
        """What the restart waits for, naming the setting that asks for it."""
        if self.min_nodes_set:
            return f"compute.min_nodes={self.needed} of its {self.nodes} nodes"
        return f"all {self.nodes} of its nodes (compute.nodes={self.nodes}; compute.min_nodes is null)"

    def __str__(self) -> str:
        fewer = (
            f"compute.min_nodes={self.needed}"
            if self.min_nodes_set
            else f"the compute.nodes={self.nodes} it needs (compute.min_nodes is null)"
        )
        return f"only {self.up} of its {self.nodes} nodes are up on compute={self.compute}, fewer than {fewer}"


def place_restart(
    planned: ComputeTarget,
    current: ComputeTarget,
    spec: JobSpec,
    config: dict[str, Any],
    *,
    restart: str,
    out: TextIO,
    prefix: str = "ddlkit: ",
    waited_s: float | None = None,
) -> Placement | Shortfall:
    """The target the job restarts on (``planned``: as submitted first; ``current``: its last run's),
    or the :class:`Shortfall` that keeps it from restarting now (fewer nodes up than it needs).
    ``restart``: "1/3"; ``prefix`` names the job in the line said (a sweep's job number);
    ``waited_s``: how long the restart has waited for capacity (said with the placement)."""
    elastic = is_elastic(planned)
    env = {PLANNED_WORLD_SIZE_ENV: str(planned.world_size)} if elastic else {}
    up = planned.nodes_up(spec)
    name = config["compute"]["name"]
    after = f" after waiting {waited_s:.0f} s for capacity" if waited_s is not None else ""
    waited = {"waited_for_capacity_s": round(waited_s, 1)} if waited_s is not None else {}
    if up is None:
        if not elastic:
            return Placement(planned)
        out.write(
            f"{prefix}restart {restart}: compute={name} cannot tell which nodes are up; restarting on all "
            f"{planned.nodes}\n"
        )
        out.flush()
        return Placement(planned, {"nodes": planned.nodes, "planned_nodes": planned.nodes}, env)
    nodes = min(up, planned.nodes)
    if nodes < planned.min_nodes:
        return Shortfall(
            up, planned.min_nodes, planned.nodes, str(name), getattr(planned.cfg, "min_nodes", None) is not None
        )
    if not elastic:
        if after:
            out.write(f"{prefix}restart {restart} on its {planned.nodes} nodes{after}\n")
            out.flush()
        return Placement(planned, waited)
    target = planned if nodes == planned.nodes else planned.with_nodes(nodes, spec)
    trainer, optimizer = OmegaConf.create(config["trainer"]), OmegaConf.create(config["optimizer"])
    before = plan_batch(trainer, planned.world_size, current.world_size)
    after_resize = plan_batch(trainer, planned.world_size, target.world_size)
    what = describe(before, after_resize, optimizer, trainer.on_resize)
    out.write(
        f"{prefix}restart {restart} on {nodes} of {planned.nodes} nodes{after} (compute.min_nodes="
        f"{planned.min_nodes}, {_ranks(target.world_size)}): {what}\n"
    )
    out.flush()
    return Placement(
        target,
        {"nodes": nodes, "planned_nodes": planned.nodes, "world_size": target.world_size, "resize": what, **waited},
        env,
    )


class CapacityWait:
    """One restart's wait for capacity: while the target has fewer of the job's nodes up than the
    restart needs, look again every ``interval_s`` (the target's poll interval, at least
    :data:`MIN_CAPACITY_POLL_S`), saying so, for up to ``wait_s`` seconds (``restart.capacity_wait_s``).
    :meth:`next_look` paces the looks, which the job's controller (:mod:`ddlkit.launch.controller`)
    makes between its steps."""

    def __init__(
        self, wait_s: float, interval_s: float, out: TextIO, *, restart: str, prefix: str = "ddlkit: "
    ) -> None:
        self.wait_s = float(wait_s)
        self.interval_s = max(float(interval_s), MIN_CAPACITY_POLL_S)
        self.out, self.restart, self.prefix = out, restart, prefix
        #: when the first look found too few nodes (the monotonic clock); None: no shortfall seen yet
        self.since: float | None = None
        self._said: tuple[int, float] | None = None

    @property
    def waited_s(self) -> float | None:
        """How long the restart has waited so far; None when its first look found enough nodes."""
        return None if self.since is None else time.monotonic() - self.since

    def next_look(self, short: Shortfall) -> float | None:
        """After a look that found ``short``: the seconds until the next one -- said on the console
        at the first look, whenever the count changes, and every :data:`CAPACITY_NOTICE_S` -- or
        None when the wait is over (:meth:`failure` says why)."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        left = self.wait_s - (now - self.since)
        if left <= 0:
            return None
        if self._said is None or self._said[0] != short.up or now - self._said[1] >= CAPACITY_NOTICE_S:
            self.out.write(
                f"{self.prefix}restart {self.restart} waits for capacity: {short}; looking again every "
                f"{self.interval_s:g} s for up to {left:.0f} s more (restart.capacity_wait_s="
                f"{self.wait_s:g})\n"
            )
            self.out.flush()
            self._said = (short.up, now)
        return min(self.interval_s, left)

    def failure(self, short: Shortfall) -> str:
        """Why the job is not restarted, in one line: what it waited for, how long, and the fix."""
        if self.wait_s <= 0:
            return (
                f"not restarted: {short}, and restart.capacity_wait_s=0 waits for none: bring nodes back or add "
                "some, lower compute.min_nodes, or let a restart wait for them (restart.capacity_wait_s=600)"
            )
        return (
            f"not restarted: it waited {self.wait_s:g} s (restart.capacity_wait_s) for {short.wanted} to be up "
            f"on compute={short.compute}, but only {short.up} {'is' if short.up == 1 else 'are'}: bring nodes "
            "back or add some, lower compute.min_nodes, or wait longer (restart.capacity_wait_s)"
        )


def _ranks(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")
