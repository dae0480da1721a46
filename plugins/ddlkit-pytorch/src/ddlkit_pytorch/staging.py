"""A copy of the training state in host memory, for a checkpoint written in the background.

The copy is taken at a step boundary on the training thread; the writer thread then serialises
the copy while the next steps change the originals. The buffers are kept and reused from one
checkpoint to the next (ddlkit writes one checkpoint at a time): copying into memory already
touched costs a third of a fresh clone (ResNet-18 with momentum, 89 MiB: 0.02 s against 0.06 s
here), and a GPU's tensors land in pinned memory, which a device-to-host copy needs to be fast.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_unflatten


class HostStaging:
    """Copies of state dicts (any nesting of dicts, lists and tuples) with every tensor in
    host memory that this object owns; the other values are kept as they are (numbers,
    strings, the RNG's tuples: nothing the training goes on to change in place). A sharded
    tensor (``DTensor``, dist=fsdp) is copied as this rank's shard, and stays a DTensor of the
    same layout."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = []

    def copy(self, state: Any) -> Any:
        """``state`` with each tensor replaced by a host copy of its current values; the copy
        stays valid until the next call."""
        leaves, spec = tree_flatten(state)
        if len(self._buffers) != len(leaves):
            self._buffers = [None] * len(leaves)
        copied = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                copied.append(leaf)
                continue
            local = leaf.to_local() if isinstance(leaf, DTensor) else leaf
            buffer = self._buffers[i]
            if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
                buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=local.is_cuda)
                self._buffers[i] = buffer
            buffer.copy_(local.detach())
            if isinstance(leaf, DTensor):
                buffer = DTensor.from_local(
                    buffer, leaf.device_mesh, leaf.placements, run_check=False, shape=leaf.shape, stride=leaf.stride()
                )
            copied.append(buffer)
        copy = tree_unflatten(copied, spec)
        _carry_metadata(state, copy)
        return copy


def _carry_metadata(original: Any, copy: Any) -> None:
    """Give the copy's dicts the ``_metadata`` attribute of the originals: a module's
    ``state_dict()`` carries each submodule's version there, which ``load_state_dict`` reads, and
    which ``torch.save`` writes with it (a snapshot's checkpoint is then the same bytes as one
    saved directly)."""
    if isinstance(original, dict):
        if hasattr(original, "_metadata"):
            copy._metadata = original._metadata
        for key, value in original.items():
            _carry_metadata(value, copy[key])
    elif isinstance(original, (list, tuple)):
        for value, copied in zip(original, copy, strict=True):
            _carry_metadata(value, copied)
