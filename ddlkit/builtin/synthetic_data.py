"""``data=synthetic``: random images generated once, on the device, as ``tf_cnn_benchmarks`` does.

Each rank builds one batch of normally distributed images and random labels (seeded) and
serves it at every step, so the numbers measure the model and the interconnect, not the
input pipeline. Accuracy on synthetic data is meaningless; loss still falls as the model
memorises the batch, which makes it a useful smoke test.

Framework libraries are imported inside :meth:`SyntheticData.loader` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import os
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import DataInfo, DataSource, Shard
from ..registry import Registration

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass
class SyntheticDataConfig:
    # square image side in pixels (ImageNet-style training uses 224)
    image_size: int = 64
    num_classes: int = 1000
    # training images per epoch (ImageNet has 1,281,167)
    length: int = 2560
    # validation images per epoch (ImageNet has 50,000)
    val_length: int = 512


class _RepeatLoader:
    """Serves one pre-built batch ``n`` times per epoch."""

    def __init__(self, batch: tuple[Any, Any], n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Any, Any]]:
        for _ in range(start_batch, self.n):
            yield self.batch


class SyntheticData(DataSource):
    frameworks = ("pytorch", "tensorflow", "keras", "numpy")

    @property
    def info(self) -> DataInfo:
        c = self.cfg
        return DataInfo(c.num_classes, c.image_size, c.length, c.val_length)

    def loader(self, framework: str, split: str, *, batch_size: int, shard: Shard, seed: int,
               device: Any = None, channels_last: bool = False) -> Any:
        length = self.cfg.length if split == "train" else self.cfg.val_length
        n = length // (batch_size * shard.world_size)
        if split == "val":
            n = max(n, 1)
        # a different batch per rank and per split, the same on every run with the same seed
        seed = seed * 1000 + shard.rank * 2 + (split == "val")
        size, classes = self.cfg.image_size, self.cfg.num_classes
        if framework == "pytorch":
            import torch

            g = torch.Generator().manual_seed(seed)
            images = torch.randn(batch_size, 3, size, size, generator=g)
            labels = torch.randint(0, classes, (batch_size,), generator=g)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            batch = (images.to(device) if device is not None else images,
                     labels.to(device) if device is not None else labels)
            return _RepeatLoader(batch, n)
        if framework == "numpy":
            import numpy as np

            rng = np.random.default_rng(seed)
            images = rng.standard_normal((batch_size, size, size, 3), dtype=np.float32)
            labels = rng.integers(0, classes, batch_size)
            return _RepeatLoader((images, labels), n)
        if framework in ("tensorflow", "keras"):
            from ._tf_synthetic import tf_synthetic_loader

            return tf_synthetic_loader(batch_size, size, classes, n, seed, device)
        raise ValueError(f"data=synthetic has no loader for framework {framework!r}")


@hookimpl
def ddlkit_data_sources():
    yield Registration("synthetic", SyntheticData, config=SyntheticDataConfig,
                       description="random images generated once on the device (benchmarking)")


def check_batch_fits(batch_size: int, image_size: int, what: str = "one batch") -> None:
    """Refuse a batch whose float32 images alone would take more than half of this machine's
    memory: it would fail deep in a framework (or swap the machine to a halt) after start-up."""
    needed = batch_size * 3 * image_size * image_size * 4
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory / 2:
        raise ConfigError(f"{what} of trainer.batch_size={batch_size} images of {image_size}x{image_size} px needs "
                          f"{needed / 2**30:,.1f} GiB as float32, more than half of this machine's "
                          f"{memory / 2**30:,.1f} GiB: lower trainer.batch_size or data.image_size.")


@hookimpl
def ddlkit_configure(config: DictConfig) -> None:
    c = config.get("data") or {}
    if c.get("name") != "synthetic":
        return
    for key, low in (("image_size", 1), ("num_classes", 1), ("length", 1), ("val_length", 0)):
        if c[key] < low:
            raise ConfigError(f"data.{key}={c[key]} is invalid: it must be >= {low}.")
    check_batch_fits(config["trainer"]["batch_size"], c["image_size"])
