"""One view of the process group for every framework plugin: rank, size, node, collectives.

A rank learns its place from the environment its launcher set: OpenMPI (``OMPI_COMM_WORLD_*``),
torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``) or none (a single process). A launcher that
knows the node layout better than the host does (``compute=local_mpi`` simulates several nodes
on one machine) says so with ``DDLKIT_NODE``, ``DDLKIT_LOCAL_RANK``, ``DDLKIT_LOCAL_SIZE`` and
``DDLKIT_NODE_SCRATCH``, which win over what MPI reports for the real host.

Two kinds of communication, deliberately separate:

* the gradient all-reduce belongs to the framework plugin and the ``dist.backend``:
  ``native`` is ``torch.distributed`` (gloo/nccl) or ``tf.distribute``; ``horovod`` is Horovod;
* the framework-neutral part lives here: the mean of logged metrics, the step at which to stop
  on SIGTERM, barriers, broadcasts. It runs over the control plane (:mod:`.control_plane`), a star of TCP
  connections to rank 0 (``DDLKIT_CONTROL_ADDR=host:port``, or ``MASTER_ADDR`` with
  ``MASTER_PORT + 1``), so it works the same under every framework and backend (a Keras
  callback cannot issue a ``tf.distribute`` collective), needs no framework import, and a rank
  that dies closes its connection: the others fail at once instead of waiting out a timeout.

With one process (``world_size == 1``) there is no connection and every collective is the
identity: the single-process path pays nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compute.layout import CONTROL_ADDR_ENV, LOCAL_RANK_ENV, LOCAL_SIZE_ENV, NODE_ENV, NODE_SCRATCH_ENV, control_port
from ..errors import ConfigError, RunError
from .control_plane import ControlPlane

_REDUCERS: dict[str, Callable[[Sequence[float]], float]] = {
    "sum": lambda xs: float(sum(xs)),
    "mean": lambda xs: float(sum(xs)) / len(xs),
    "max": lambda xs: float(max(xs)),
    "min": lambda xs: float(min(xs)),
}


def control_address(env: Mapping[str, str]) -> tuple[str, int]:
    """Where rank 0's control plane listens: ``DDLKIT_CONTROL_ADDR``, else ``MASTER_ADDR`` and
    ``MASTER_PORT + 1`` (the port after the framework's own rendezvous port)."""
    if env.get(CONTROL_ADDR_ENV):
        host, _, port = env[CONTROL_ADDR_ENV].rpartition(":")
        if host and port.isdigit():
            return host.strip("[]"), int(port)
        raise ConfigError(f"{CONTROL_ADDR_ENV}={env[CONTROL_ADDR_ENV]} is invalid: it must be host:port.")
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT", "").isdigit():
        return env["MASTER_ADDR"], control_port(int(env["MASTER_PORT"]))
    raise ConfigError(
        f"this job has several ranks but no rendezvous address: the compute target must set "
        f"MASTER_ADDR and MASTER_PORT (rank 0's host and a free port) or {CONTROL_ADDR_ENV}. "
        "compute=local_mpi and torchrun set them."
    )


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
    #: this node's local scratch directory ("local SSD") when the launcher provides one
    node_scratch: str | None = None
    #: seconds a collective waits for the slowest rank before failing
    timeout_s: float = 1800.0
    #: seconds without a heartbeat from a rank before the others say that it does not answer
    warn_after_s: float = 60.0
    _plane: ControlPlane | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that logs, checkpoints and writes result.json."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """Local rank 0: does per-node duties such as staging data to the node's disk."""
        return self.local_rank == 0

    # ------------------------------------------------------------ connection
    def connect(self, job_id: str, env: Mapping[str, str] | None = None) -> None:
        """Join the control plane (all ranks call this at start; a no-op for one process)."""
        if self.world_size == 1 or self._plane is not None:
            return
        address = control_address(os.environ if env is None else env)
        object.__setattr__(
            self,
            "_plane",
            ControlPlane.connect(self.rank, self.world_size, address, job_id, self.timeout_s, self.warn_after_s),
        )

    def track_step(self, step: Callable[[], int], where: Callable[[], str] | None = None) -> None:
        """Have the heartbeats carry ``step()``, so that a rank that stops answering is reported
        with the step it had reached; a hang report says ``where()`` too (the step's phase)."""
        if self._plane is not None:
            self._plane.step = step
            if where is not None:
                self._plane.where = where

    def write_stacks_on_hang(self, job_dir: Path) -> None:
        """When a rank falls silent (``warn_after_s``), every rank that answers writes its stacks to
        ``<job_dir>/hang/rank-N.txt`` (:mod:`ddlkit.rank.hang`); rank 0 then says who is not where
        the others wait."""
        if self._plane is None:
            return
        from .hang import stack_file, write_own_stacks

        def dump(header: str) -> str:
            path = stack_file(job_dir, self.rank)
            write_own_stacks(path, header)
            return str(path)

        self._plane.on_dump = dump

    @property
    def wait_s(self) -> float:
        """Seconds this rank has spent in control-plane collectives so far (0 for one process)."""
        return 0.0 if self._plane is None else self._plane.wait_s

    def silent_ranks(self) -> list[str]:
        """A sentence for each rank that has stopped answering (none for one process): what a
        failure while the ranks wait for each other is most likely due to."""
        return [] if self._plane is None else self._plane.silent_ranks()

    def lost_ranks(self, wait_s: float = 0.0) -> list[int]:
        """The other ranks whose process has ended (none for one process), waiting up to
        ``wait_s`` for a first one (see :meth:`ControlPlane.lost_ranks`)."""
        return [] if self._plane is None else self._plane.lost_ranks(wait_s)

    def close(self) -> None:
        if self._plane is not None:
            self._plane.close()
            object.__setattr__(self, "_plane", None)

    def _exchange(self, op: str, data: Any, combine: Callable[[list[Any]], Any]) -> Any:
        if self._plane is None:
            raise RunError(
                f"dist.backend={self.backend}: {op} across {self.world_size} ranks before DistContext.connect()",
                component="dist",
            )
        return self._plane.exchange(op, data, combine)

    # ------------------------------------------------------------ collectives
    def allreduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Element-wise ``sum``/``mean``/``max``/``min`` of ``values`` over all ranks, summed in
        rank order in float64, so every rank gets bit-identical results."""
        reduce = _REDUCERS[op]
        values = [float(v) for v in values]
        if self.world_size == 1:
            return values

        def combine(gathered: list[list[float]]) -> list[float]:
            if len({len(v) for v in gathered}) != 1:
                raise RunError(
                    f"allreduce of different lengths across ranks: {[len(v) for v in gathered]}", component="dist"
                )
            return [reduce(column) for column in zip(*gathered, strict=True)]

        return self._exchange(f"allreduce:{op}", values, combine)

    def allreduce_mean(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Average scalar metrics over ranks (identity for a single process). Every rank must
        pass the same keys."""
        if self.world_size == 1:
            return dict(metrics)
        keys = sorted(metrics)
        means = self._exchange("allreduce_mean", [keys, [float(metrics[k]) for k in keys]], _mean_by_key)
        return dict(zip(keys, means, strict=True))

    def mean_and_gather(self, metrics: Mapping[str, float], extra: Any) -> tuple[dict[str, float], list[Any] | None]:
        """:meth:`allreduce_mean` of ``metrics`` and, in the same round trip, every rank's ``extra``
        gathered on rank 0 (in rank order; None on the other ranks, which do not need it)."""
        if self.world_size == 1:
            return dict(metrics), [extra]
        keys = sorted(metrics)
        gathered: list[Any] = []

        def combine(values: list[list[Any]]) -> list[float]:
            gathered.extend(value[1] for value in values)
            return _mean_by_key([value[0] for value in values])

        means = self._exchange("mean_and_gather", [[keys, [float(metrics[k]) for k in keys]], extra], combine)
        return dict(zip(keys, means, strict=True)), (gathered if self.is_main else None)

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on any rank: how ranks agree to stop together."""
        if self.world_size == 1:
            return flag
        return bool(self._exchange("any", bool(flag), any))

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """``obj`` as passed on rank ``root``, on every rank (JSON-serialisable values)."""
        if self.world_size == 1:
            return obj
        return self._exchange(f"broadcast:{root}", obj, lambda values: values[root])

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (JSON-serialisable values)."""
        if self.world_size == 1:
            return [obj]
        return self._exchange("allgather", obj, list)

    def barrier(self) -> None:
        if self.world_size != 1:
            self._exchange("barrier", None, lambda values: None)

    # ------------------------------------------------------------ construction
    @classmethod
    def from_env(
        cls,
        backend: str = "none",
        env: Mapping[str, str] | None = None,
        *,
        timeout_s: float = 1800.0,
        warn_after_s: float = 60.0,
    ) -> DistContext:
        env = os.environ if env is None else env

        def pick(*names: str, default: int) -> int:
            for n in names:
                if env.get(n, "") != "":
                    return int(env[n])
            return default

        rank = pick("OMPI_COMM_WORLD_RANK", "RANK", default=0)
        world = pick("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
        local_rank = pick(LOCAL_RANK_ENV, "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", default=0)
        local_size = pick(LOCAL_SIZE_ENV, "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=1)
        # OpenMPI has no node index (OMPI_COMM_WORLD_NODE_RANK is a rank *within* the node);
        # ranks are placed node by node, so the index follows from the rank and the local size
        node = pick(NODE_ENV, "GROUP_RANK", default=rank // max(local_size, 1))
        return cls(
            rank,
            world,
            local_rank,
            local_size,
            node,
            backend,
            env.get(NODE_SCRATCH_ENV) or None,
            timeout_s,
            warn_after_s,
        )


def _mean_by_key(gathered: list[list[Any]]) -> list[float]:
    keys = gathered[0][0]
    for rank, (other, _) in enumerate(gathered):
        if other != keys:
            raise RunError(f"ranks report different metrics: rank 0 {keys}, rank {rank} {other}", component="dist")
    return [sum(column) / len(gathered) for column in zip(*(vals for _, vals in gathered), strict=True)]
