"""``data=synthetic``: images generated once, in memory, that carry their label.

Each class has a pattern (a random 4x4 RGB grid, blown up to the image size, the same on
every rank and in both splits); an image is its class's pattern plus standard normal noise. So
a model can learn the task -- validation top-1 climbs far above chance within the default run --
while no image is ever read or decoded. Each rank generates its own batches (numpy, seeded by
``trainer.seed``, its rank and the split) once, when its loader is built: up to
``data.pool_mib`` MiB of distinct batches per split, which the epochs cycle through. Serving a
batch is then free, as in ``tf_cnn_benchmarks``, so throughput measures the model and the
interconnect, not an input pipeline. Framework plugins copy the batches to their device once.

Framework-neutral: the loader serves numpy :class:`ddlkit.Batch` es (NHWC).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import Batch, DataInfo, DataSource, ImagePoolSpec, Shard
from ..interfaces.data import check_split
from ..options import at_least, checked
from ..registry import Registration

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: side of the per-class pattern grid before it is blown up to the image size
PATTERN_GRID = 4


@dataclass
class SyntheticDataConfig:
    # square image side in pixels (ImageNet-style training uses 224)
    image_size: int = checked(64, at_least(1))
    num_classes: int = checked(1000, at_least(1))
    # training images per epoch (ImageNet has 1,281,167)
    length: int = checked(2560, at_least(1))
    # validation images per epoch (ImageNet has 50,000)
    val_length: int = checked(512, at_least(0))
    # distinct batches generated per split, at most this many MiB (the epochs cycle through them)
    pool_mib: int = checked(128, at_least(1))


class SyntheticImages:
    """A split's batches: ``len(self)`` per epoch, drawn in turn from a pool of distinct ones.

    Framework adapters may take the pool from :meth:`native_spec` to put it on their device at once."""

    def __init__(self, *, batch_size: int, image_size: int, num_classes: int, batches: int, pool_mib: int,
                 seed: int, stream: tuple[int, ...]) -> None:
        self.batch_size, self.image_size, self.num_classes = batch_size, image_size, num_classes
        #: ``seed`` draws the class patterns, ``(seed, *stream)`` this loader's labels and noise
        self.batches, self.seed, self.stream = batches, seed, stream
        batch_bytes = batch_size * image_size * image_size * 3 * 4
        #: distinct batches generated
        self.pool_size = max(1, min(batches, pool_mib * 2**20 // batch_bytes))

    def __len__(self) -> int:
        return self.batches

    @cached_property
    def pool(self) -> tuple[Any, Any]:
        """``(images, labels)``: float32 ``(pool, batch, size, size, 3)`` and int64 ``(pool, batch)``."""
        import numpy as np

        size, grid = self.image_size, PATTERN_GRID
        patterns = np.random.default_rng(self.seed).standard_normal((self.num_classes, grid, grid, 3),
                                                                    dtype=np.float32)
        block = -(-size // grid)
        rng = np.random.default_rng((self.seed, *self.stream))
        labels = rng.integers(0, self.num_classes, (self.pool_size, self.batch_size))
        images = rng.standard_normal((self.pool_size, self.batch_size, size, size, 3), dtype=np.float32)
        for k in range(self.pool_size):  # a batch at a time: no pool-sized temporary
            images[k] += patterns[labels[k]].repeat(block, axis=1).repeat(block, axis=2)[:, :size, :size]
        return images, labels

    def native_spec(self) -> ImagePoolSpec:
        """The pool, which a framework puts on its device at once."""
        images, labels = self.pool
        return ImagePoolSpec(images, labels, batches=self.batches)

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        pool = self.native_spec()
        for k in range(start_batch, self.batches):
            i = pool.index(epoch, k)
            yield Batch(pool.images[i], pool.labels[i])


class SyntheticData(DataSource):
    def configure(self, config: DictConfig) -> None:
        check_batch_fits(config.trainer.batch_size, self.cfg.image_size)

    @property
    def info(self) -> DataInfo:
        c = self.cfg
        return DataInfo(c.num_classes, c.image_size, c.length, c.val_length)

    def config_info(self) -> DataInfo:
        return self.info

    def loader(self, split: str, *, batch_size: int, shard: Shard, seed: int) -> SyntheticImages:
        check_split(split)
        length = self.cfg.length if split == "train" else self.cfg.val_length
        n = length // (batch_size * shard.world_size)
        if split == "val":
            n = max(n, 1)
        c = self.cfg
        # the patterns are the task, the same everywhere; the labels and noise differ per rank and split
        return SyntheticImages(batch_size=batch_size, image_size=c.image_size, num_classes=c.num_classes, batches=n,
                               pool_mib=c.pool_mib, seed=seed, stream=(shard.rank, split == "val"))


@hookimpl
def ddlkit_data_sources():
    yield Registration("synthetic", SyntheticData, config=SyntheticDataConfig,
                       description="images generated in memory, a class pattern plus noise (benchmarking, smoke tests)")


def check_batch_fits(batch_size: int, image_size: int, what: str = "one batch") -> None:
    """Refuse a batch whose float32 images alone would take more than half of this machine's
    memory: it would fail deep in a framework (or swap the machine to a halt) after start-up."""
    needed = batch_size * 3 * image_size * image_size * 4
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory / 2:
        raise ConfigError(f"{what} of trainer.batch_size={batch_size} images of {image_size}x{image_size} px needs "
                          f"{needed / 2**30:,.1f} GiB as float32, more than half of this machine's "
                          f"{memory / 2**30:,.1f} GiB: lower trainer.batch_size or data.image_size.")

