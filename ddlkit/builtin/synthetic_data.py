"""Images generated once, in memory, that carry their label: the default data source, so the
quick start needs no dataset. Each class has a pattern (a random 4x4 RGB grid, blown up to the
image size, the same on every rank and in both splits); an image is its class's pattern plus
standard normal noise. So a model can learn the task (the quick start ends at a validation top-1
of 0.63 over 1000 classes, where chance is 0.001) while no image is ever read or decoded.

    ddlkit data=synthetic data.image_size=224 data.length=12800 model=resnet50

Serving a batch costs nothing, as in `tf_cnn_benchmarks`, so throughput measures the model and
the interconnect, not an input pipeline. For real images use
[data=imagefolder](imagefolder.md); for your own arrays, [data=custom](custom.md).

After a change of world size ([elastic jobs](../failures.md#elastic-world-size-fewer-nodes-then-all-again))
a step sees other random images of the same classes: each rank draws its batches from a pool of
its own.

## How it works

Each rank generates its own batches (numpy, seeded by `trainer.seed`, its rank and the split)
once: up to `data.pool_mib` MiB of distinct batches per split, which the epochs cycle through. It
starts in the background when the rank prepares its data, so the pools are made while the
framework imports (torch: 2-3 s of Python; numpy draws without holding the interpreter), not
after it. Framework plugins copy the batches to their device once. The loader is
framework-neutral: it serves numpy `ddlkit.Batch`es (NHWC), and describes its pool with
`ddlkit.ImagePoolSpec` for the frameworks' native pipelines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import DataInfo, DataSource, Shard
from ..interfaces.data import check_split
from ..options import at_least, checked
from ..registry import Registration

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..images import SyntheticImages
    from ..interfaces import RunContext


@dataclass
class SyntheticDataConfig:
    # square image side in pixels (ImageNet-style training uses 224)
    image_size: int = checked(64, at_least(1))
    # classes, each a pattern of its own
    num_classes: int = checked(1000, at_least(1))
    # training images per epoch (ImageNet has 1,281,167)
    length: int = checked(2560, at_least(1))
    # validation images per epoch (ImageNet has 50,000)
    val_length: int = checked(512, at_least(0))
    # distinct batches generated per split, at most this many MiB (the epochs cycle through them)
    pool_mib: int = checked(128, at_least(1))


class SyntheticData(DataSource):
    def __init__(self, cfg: SyntheticDataConfig) -> None:
        super().__init__(cfg)
        #: the loaders ``prepare`` started, by what they were made for, until a framework asks for them
        self._started: dict[tuple[object, ...], SyntheticImages] = {}

    def configure(self, config: DictConfig) -> None:
        check_batch_fits(config.trainer.batch_size, self.cfg.image_size)

    def prepare(self, run: RunContext) -> None:
        """Start making this rank's pools now, in the background: the framework imports next
        (torch: 2-3 s), and the pools are ready when its loaders are asked for."""
        t, shard = run.cfg.trainer, Shard(run.dist.rank, run.dist.world_size)  # the run's loaders' (Run.loaders)
        for split in ("train", "val") if t.validate else ("train",):
            key = (split, t.batch_size, shard, t.seed)
            self._started[key] = self._make(split, batch_size=t.batch_size, shard=shard, seed=t.seed).start()

    @property
    def info(self) -> DataInfo:
        c = self.cfg
        return DataInfo(c.num_classes, c.image_size, c.length, c.val_length)

    def config_info(self) -> DataInfo:
        return self.info

    def loader(self, split: str, *, batch_size: int, shard: Shard, seed: int) -> SyntheticImages:
        check_split(split)
        started = self._started.pop((split, batch_size, shard, seed), None)
        return started if started is not None else self._make(split, batch_size=batch_size, shard=shard, seed=seed)

    def _make(self, split: str, *, batch_size: int, shard: Shard, seed: int) -> SyntheticImages:
        length = self.cfg.length if split == "train" else self.cfg.val_length
        n = length // (batch_size * shard.world_size)
        if split == "val":
            n = max(n, 1)
        from ..images import SyntheticImages  # numpy: imported where batches are made, not when the plugin loads

        c = self.cfg
        # the patterns are the task, the same everywhere; the labels and noise differ per rank and split
        return SyntheticImages(
            batch_size=batch_size,
            image_size=c.image_size,
            num_classes=c.num_classes,
            batches=n,
            pool_mib=c.pool_mib,
            seed=seed,
            stream=(shard.rank, split == "val"),
        )


@hookimpl
def ddlkit_data_sources():
    yield Registration(
        "synthetic",
        SyntheticData,
        config=SyntheticDataConfig,
        description="images generated in memory, a class pattern plus noise (benchmarking, smoke tests)",
    )


def check_batch_fits(batch_size: int, image_size: int, what: str = "one batch") -> None:
    """Refuse a batch whose float32 images alone would take more than half of this machine's
    memory: it would fail deep in a framework (or swap the machine to a halt) after start-up."""
    needed = batch_size * 3 * image_size * image_size * 4
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory / 2:
        raise ConfigError(
            f"{what} of trainer.batch_size={batch_size} images of {image_size}x{image_size} px needs "
            f"{needed / 2**30:,.1f} GiB as float32, more than half of this machine's "
            f"{memory / 2**30:,.1f} GiB: lower trainer.batch_size or data.image_size."
        )
