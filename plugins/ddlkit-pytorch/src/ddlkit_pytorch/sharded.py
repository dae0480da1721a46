"""``dist=fsdp``: the model sharded over the ranks with FSDP2, and its sharded checkpoints.

**Sharding.** ``torch.distributed.fsdp.fully_shard`` is applied to each *block* of the model (the
ResNets' residual blocks, the ViTs' encoder blocks, or the classes ``framework.fsdp_blocks``
names), then to the whole model for the parameters outside any block (the stem, the head). Each
rank keeps 1/N of every parameter, of its gradient and of the optimizer's state; a block's
parameters are gathered just before its forward pass and freed after it
(``framework.fsdp_reshard_after_forward``), its gradients reduce-scattered in the backward pass.
Under ``trainer.precision=bf16`` the gathered parameters are bf16 and the gradients are reduced
in fp32 (``MixedPrecisionPolicy``); the sharded parameters and the optimizer stay fp32.

**Checkpoints** are directories written with ``torch.distributed.checkpoint`` (DCP): each rank
writes its shards (``__<rank>_0.distcp``), rank 0 the index (``.metadata``) and ``extra.pt``
(the loss scaler, the random state, ddlkit's position). The state is taken with
``get_state_dict``, keyed by the parameters' names, so a checkpoint loads into any number of ranks
-- 2 ranks resume on 1 and back -- and into a model that is not sharded at all. ddlkit's manifest,
verification and ``latest`` rules hold as for any checkpoint (:class:`ddlkit.rank.checkpointing.
CheckpointKeeper`, sharded mode). A write in the background copies this rank's shards into host
memory at the step and writes them on a thread, over a gloo process group of its own (collectives
of two threads must not share a group).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ddlkit

from .framework import random_state, set_random_state
from .staging import HostStaging

#: rank 0's file in a sharded checkpoint: what is not a tensor of the model or the optimizer
EXTRA_FILE = "extra.pt"


def shard_units(model: nn.Module, names: Iterable[str], default: tuple[type, ...]) -> list[nn.Module]:
    """The modules that are each sharded on their own: those whose class is named in ``names``
    (by name or ``module.QualName``), or, with no names, those of the ``default`` classes. A
    name no module of the model has is a ConfigError listing the classes it has."""
    names = list(names)
    if not names:
        return [m for m in model.modules() if m is not model and isinstance(m, default)]

    def named(m: nn.Module) -> bool:
        cls = type(m)
        return cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names

    units = [m for m in model.modules() if m is not model and named(m)]
    found = {n for m in units for n in (type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")}
    if missing := [n for n in names if n not in found]:
        classes = sorted({type(m).__name__ for m in model.modules()})
        raise ddlkit.ConfigError(
            f"framework.fsdp_blocks names {', '.join(missing)}, which the model has no module of: "
            f"name classes of its modules ({', '.join(classes)})."
        )
    return units


def checkpoint_activations(units: list[nn.Module]) -> None:
    """Each unit's activations are recomputed in the backward pass instead of kept (non-reentrant
    activation checkpointing, applied in place: parameter names stay as they are)."""
    from torch.distributed._composable import checkpoint

    for unit in units:
        checkpoint(unit)


#: mallopt's parameter for the size from which malloc maps blocks of their own (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3


def return_large_frees(threshold_mib: int) -> bool:
    """Have glibc's malloc serve blocks of ``threshold_mib`` MiB and more with mmap, which returns
    them to the system when they are freed (``mallopt(M_MMAP_THRESHOLD)``; framework.
    fsdp_mmap_threshold_mib). By default glibc raises that threshold, up to 32 MiB, each time such a
    block is freed, and serves later ones of that size from its heap, which keeps what is freed in
    the process. Sharded training frees blocks of parameter size all along -- the whole model built
    before it is sharded, each block gathered for its forward and backward passes, each shard copied
    by a checkpoint write -- and the heap they fragment grows (ViT-L/16, AdamW, 2 ranks on the CPU:
    peak RSS 3.75 GiB a rank, 2.89 with a 1 MiB threshold; ViT-B/16 2282 -> 1118 MiB). The price is
    speed: each step maps and faults in the blocks it gathers anew (ViT-B/16: 0.60x the images/sec, ViT-L/16: 0.94x),
    so it is the user's choice, off by default. Whether it was set: not where the C library is not
    glibc's, nor over a MALLOC_MMAP_THRESHOLD_ of the environment (that choice stands)."""
    import ctypes
    import os

    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt: not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_mib * 2**20))


def shard(
    model: nn.Module, units: list[nn.Module], *, world_size: int, device: Any, bf16: bool, reshard_after_forward: bool
) -> nn.Module:
    """``model`` sharded over the job's ranks: each unit, then the model itself (in place)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if policy is not None:
        options["mp_policy"] = policy
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return model


def full_state_dict(model: nn.Module) -> dict[str, Any]:
    """The plain, unsharded state dict of ``model`` on rank 0 (in host memory; empty on the other
    ranks, which must call this too: it gathers): the ``model.pt`` a user loads without ddlkit."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class ShardedCheckpoints:
    """How a sharded checkpoint holds the model, the optimizer, the loss scaler and the random
    state: the ``save``/``load``/``snapshot`` of :meth:`ddlkit.RunContext.checkpointing`."""

    def __init__(self, model: nn.Module, optimizer: Any, scaler: Any, *, device: Any, rank: int, group: Any) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.device, self.rank = device, rank
        #: the process group of checkpoint writes (None: one process)
        self.group = group
        self._staging = HostStaging()

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def _extra(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict(), "rng": random_state(self.device), "meta": meta}

    def _write(self, path: Path, state: dict[str, Any], extra: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        path.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            with open(path / EXTRA_FILE, "wb") as f:  # a file object: see PytorchFramework._checkpointing
                torch.save(extra, f)
        try:
            # returns on every rank once every rank's shards and the index are written
            dcp.save(state, storage_writer=dcp.FileSystemWriter(path), process_group=self.group)
        except CheckpointException as err:
            # DCP gathers every rank's outcome, so all ranks are here together and write again, once:
            # a shard write fails now and then for no lasting reason (torch.save's "unexpected pos 704
            # vs 598", seen in 2 of some 60 writes here, and by others' DCP jobs); a lasting one (a
            # full disk) fails again and ends the run with the previous checkpoint the latest
            if self.rank == 0:
                rank, (first, _) = min(err.failures.items())
                print(
                    f"ddlkit: warning: writing checkpoint {path.name} failed on rank(s) "
                    f"{', '.join(map(str, sorted(err.failures)))} (rank {rank}: {type(first).__name__}: "
                    f"{(str(first).strip().splitlines() or [''])[-1][:200]}); writing it again",
                    file=sys.stderr,
                    flush=True,
                )
            dcp.save(state, storage_writer=dcp.FileSystemWriter(path), process_group=self.group)

    def save(self, path: Path, meta: dict[str, Any]) -> None:
        self._write(path, self._state(), self._extra(meta))

    def snapshot(self, meta: dict[str, Any]) -> Callable[[Path], None]:
        state, extra = self._staging.copy(self._state()), self._extra(meta)
        return lambda path: self._write(path, state, extra)

    def load(self, path: Path) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()  # what to load into: this run's shapes and shards
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), process_group=self.group)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        extra = torch.load(path / EXTRA_FILE, map_location="cpu", weights_only=True)
        self.scaler.load_state_dict(extra["scaler"])
        set_random_state(extra["rng"], self.device)
        return extra["meta"]
