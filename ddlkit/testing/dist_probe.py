"""A plugin the distributed tests load into every rank (``DDLKIT_PLUGINS=ddlkit.testing.dist_probe``,
which :mod:`ddlkit.testing.multirank` sets):

* ``data=twin``: the same images on every rank, a different label for every sample. Sample ``i``
  of a global batch shows image ``i % unique`` with label ``i``'s. With ``unique`` equal to the
  per-rank batch of a 2-rank job, each rank sees all ``unique`` images once, and a 1-rank job with
  twice the batch sees each image twice with the labels of both ranks. BatchNorm in training mode
  normalises with its batch's statistics, which depend only on the images: they are the same
  for one rank's batch and for the doubled batch, so the mean gradient of the doubled batch is
  exactly the mean of the two ranks' gradients -- the equality data parallelism promises, made
  exact despite per-rank BatchNorm. The labels differ per rank, so the ranks' gradients do too:
  without (or with a wrong) all-reduce, the replicas drift apart or miss the 1-rank result.
* every rank saves its final weights to ``weights-rank-N.npz`` at ``ddlkit_run_end`` (from the
  framework's ``model`` attribute), so tests can compare the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import ddlkit


@dataclass
class TwinConfig:
    image_size: int = 32
    num_classes: int = 10
    # distinct images; sample i of a global batch shows image i % unique
    unique: int = 4
    length: int = 64
    val_length: int = 16


class _Repeat:
    def __init__(self, batch: ddlkit.Batch, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Any:
        for _ in range(start_batch, self.n):
            yield self.batch


class TwinData(ddlkit.DataSource):
    """Framework-neutral, like every data source: numpy batches that each framework adapts."""

    @property
    def info(self) -> ddlkit.DataInfo:
        c = self.cfg
        return ddlkit.DataInfo(c.num_classes, c.image_size, c.length, c.val_length)

    def loader(self, split: str, *, batch_size: int, shard: ddlkit.Shard, seed: int) -> Any:
        c = self.cfg
        rng = np.random.default_rng(seed)
        pictures = rng.standard_normal((c.unique, c.image_size, c.image_size, 3)).astype(np.float32)
        all_labels = rng.integers(0, c.num_classes, 1 << 16)
        index = np.arange(shard.rank * batch_size, (shard.rank + 1) * batch_size)
        n = max(1, (c.length if split == "train" else c.val_length) // (batch_size * shard.world_size))
        return _Repeat(ddlkit.Batch(pictures[index % c.unique], all_labels[index]), n)


@ddlkit.hookimpl
def ddlkit_data_sources():
    yield ddlkit.Registration("twin", TwinData, config=TwinConfig, description="test data: same images on every rank")


@ddlkit.hookimpl
def ddlkit_run_end(run: ddlkit.RunContext, status: str) -> None:
    model = getattr(run.framework, "model", None)
    if model is None:
        return
    if hasattr(model, "state_dict"):  # torch; with dist=fsdp, this rank's shards
        state = model.state_dict()
        local = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in state.items()}
        # tensors only: a module's extra state (get_extra_state) may be any value
        arrays = {k: v.detach().cpu().numpy() for k, v in local.items() if hasattr(v, "detach")}
    else:  # keras
        arrays = {w.path: np.asarray(w) for w in model.weights}
    np.savez(run.job_dir / f"weights-rank-{run.dist.rank}.npz", **arrays)
