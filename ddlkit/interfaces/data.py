"""Data sources: where training and validation batches come from.

A data source names no framework. It serves framework-neutral batches -- :class:`Batch`, numpy
arrays -- through a :class:`Loader`, and each framework plugin owns the adapter that turns a
loader into its tensors and input pipeline (``ddlkit_pytorch.data``, ``ddlkit_tensorflow.data``).
A loader may also describe its images with a ``native_spec()`` method (:func:`native_spec`:
:class:`ImageFilesSpec`, :class:`ImagePoolSpec`), so that an adapter builds a native pipeline from
the description instead of converting numpy batches (the built-in image-folder and synthetic
loaders get ``DataLoader`` worker processes and ``tf.data`` graphs that way); a loader that
describes nothing is served through its numpy batches, so a new data source works with every
framework and a new framework with every data source.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .run import RunContext

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


@dataclass(frozen=True)
class ImageFilesSpec:
    """A loader's images as files to decode (``data=imagefolder``'s): a framework's pipeline
    reads them in ``ddlkit.builtin.imagefolder``'s order for ``batch_size``, ``shard`` and
    ``seed``, with the crops of ``aug``, so that it serves the same batches as the loader."""

    files: Sequence[str]
    #: int64 class index of each file
    labels: Any
    #: the augmentation: crop, flip, resize, normalization and decoder (``ddlkit.builtin.imagefolder``)
    aug: Any
    batch_size: int
    shard: Shard
    seed: int
    #: ``data.workers`` as configured: -1 lets each pipeline choose (see :meth:`auto_workers`)
    workers: int
    #: a file that cannot be decoded: ``"error"`` or ``"skip"`` (the next image that decodes)
    on_corrupt: str
    #: ranks on this node, which share its cores
    local_size: int = 1

    def auto_workers(self) -> int:
        """``workers``, with -1 resolved to the node's cores divided among its ranks."""
        if self.workers >= 0:
            return self.workers
        return max(1, len(os.sched_getaffinity(0)) // max(self.local_size, 1))


@dataclass(frozen=True)
class ImagePoolSpec:
    """A loader's batches as a pool generated once that the epochs cycle through
    (``data=synthetic``'s): a framework puts the whole pool on its device once."""

    #: float32 ``(pool, batch, size, size, 3)``
    images: Any
    #: int64 ``(pool, batch)``
    labels: Any
    #: batches per epoch
    batches: int

    def index(self, epoch: int, batch: int) -> int:
        """Which pooled batch is batch ``batch`` of ``epoch``."""
        return (epoch * self.batches + batch) % len(self.images)


class Loader(Protocol):
    """Framework-neutral batches of one split, re-iterable per epoch. A loader may also define
    ``native_spec()`` (see :func:`native_spec`)."""

    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        """Yield the batches of ``epoch`` (0-based), skipping the first ``start_batch`` so that a
        run resumed mid-epoch sees exactly the batches it had not yet seen."""


def native_spec(loader: Loader) -> ImageFilesSpec | ImagePoolSpec | None:
    """What ``loader`` declares about its images through its optional ``native_spec()`` method,
    from which a framework adapter may build its own pipeline; None for a loader that only yields
    batches. Optional, and so asked here rather than declared on :class:`Loader`: a data source's
    loader need not know about native pipelines to work with every framework."""
    declared = getattr(loader, "native_spec", None)
    return declared() if declared is not None else None


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

    def config_info(self) -> DataInfo | None:
        """:attr:`info` when this source's config alone states it -- no file listed, no user code
        imported -- else None (the default: only the ranks, once the data is readable, know it).
        The launcher checks the job against it (one global batch at least) before anything runs."""
        return None

    def prepare(self, run: RunContext) -> None:
        """Called on every rank before loaders are built: stage files, wait for local rank 0."""

    @abstractmethod
    def loader(self, split: Split, *, batch_size: int, shard: Shard, seed: int) -> Loader:
        """A loader of this rank's batches of ``batch_size`` for ``split`` (``"train"`` or ``"val"``):
        training batches are full, the last validation batch may be short."""


def check_split(split: str) -> None:
    """Refuse anything but ``train`` and ``val``: callers of the 0.1 signature passed a framework first."""
    if split not in SPLITS:
        raise ValueError(
            f"split must be one of {', '.join(SPLITS)}, got {split!r} (DataSource.loader takes no "
            "framework: batches are framework-neutral, and framework plugins adapt them)"
        )
