"""Which images a rank reads in which order, per epoch; shared by every framework's pipeline.

Training: all ranks draw the same permutation from ``(seed, epoch)``, keep the first
``n // (batch * world)`` global batches' worth of it, and rank ``r`` takes every ``world``-th
image from position ``r``. So every epoch is a fresh shuffle, the ranks' shards never overlap,
every rank has the same number of batches, and batch ``k`` of an epoch is known without reading
batches ``0..k-1``, which is what makes resuming mid-epoch exact and free.

Validation: in file order, ``n // world`` images per rank, the last batch possibly short.
"""

from __future__ import annotations

import numpy as np

from ..interfaces import Shard


def num_batches(n: int, batch_size: int, shard: Shard, train: bool) -> int:
    if train:
        return n // (batch_size * shard.world_size)
    return -(-(n // shard.world_size) // batch_size)


def epoch_order(n: int, *, batch_size: int, shard: Shard, seed: int, epoch: int, train: bool) -> np.ndarray:
    """Indices (into the split) this rank reads in ``epoch``, in order."""
    if train:
        used = num_batches(n, batch_size, shard, train) * batch_size * shard.world_size
        order = np.random.default_rng([seed, epoch]).permutation(n)[:used]
        return order[shard.rank :: shard.world_size]
    per_rank = n // shard.world_size
    return np.arange(n)[shard.rank :: shard.world_size][:per_rank]
