"""Data sources: where training and validation batches come from.

A data source names no framework. It serves framework-neutral batches -- :class:`Batch`, numpy
arrays -- through a :class:`Loader`, and each framework plugin owns the adapter that turns a
loader into its tensors and input pipeline (``ddlkit_pytorch.data``, ``ddlkit_tensorflow.data``).
An adapter may recognise a loader class it knows and build a native pipeline for it instead of
converting numpy batches (the built-in image-folder and synthetic loaders get ``DataLoader``
worker processes and ``tf.data`` graphs that way); a loader it does not know is served through
its numpy batches, so a new data source works with every framework and a new framework with
every data source.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..run import Run

Split = Literal["train", "val"]
SPLITS: tuple[str, ...] = ("train", "val")


@dataclass(frozen=True)
class DataInfo:
    """What a framework needs to know to build a model for this data."""

    #: classes of a classification task (0: not a classification task)
    num_classes: int
    #: square side of the images; 0 when the inputs are not images (passed to models as they are)
    image_size: int
    #: number of samples per epoch in each split
    train_length: int
    val_length: int


@dataclass(frozen=True)
class Shard:
    """This rank's slice of the data: batches are split across ``world_size`` ranks."""

    rank: int = 0
    world_size: int = 1


class Batch(NamedTuple):
    """One batch, framework-neutral: numpy arrays whose first axis is the batch.

    Images (``DataInfo.image_size > 0``) are float32 NHWC, normalized; each framework's adapter
    gives them to its models in its own layout (PyTorch: NCHW). Classification targets are int64
    class indices; other tasks' targets are whatever their loss expects. A NamedTuple, so
    ``images, labels = batch`` works.
    """

    inputs: Any
    targets: Any


class Loader(Protocol):
    """Framework-neutral batches of one split, re-iterable per epoch."""

    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        """Yield the batches of ``epoch`` (0-based), skipping the first ``start_batch`` so that a
        run resumed mid-epoch sees exactly the batches it had not yet seen."""


class DataSource(ABC):
    """Produces framework-neutral batches (see the module docstring)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def configure(self, config: DictConfig) -> None:
        """Validate this data source's options against the whole composed ``config`` in the launcher,
        before anything runs; raise ConfigError. Called for the selected data source only (the
        launcher builds it for it: a constructor does no I/O)."""

    @property
    @abstractmethod
    def info(self) -> DataInfo: ...

    def prepare(self, run: Run) -> None:
        """Called on every rank before loaders are built: stage files, wait for local rank 0."""

    @abstractmethod
    def loader(self, split: Split, *, batch_size: int, shard: Shard, seed: int) -> Loader:
        """A loader of this rank's batches of ``batch_size`` for ``split`` (``"train"`` or ``"val"``):
        training batches are full, the last validation batch may be short."""


def check_split(split: str) -> None:
    """Refuse anything but ``train`` and ``val``: callers of the 0.1 signature passed a framework first."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r} (DataSource.loader takes no "
                         "framework: batches are framework-neutral, and framework plugins adapt them)")
