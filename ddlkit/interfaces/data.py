"""Data sources: where training and validation batches come from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    from ..run import Run

Split = Literal["train", "val"]


@dataclass(frozen=True)
class DataInfo:
    """What a framework needs to know to build a model for this data."""

    num_classes: int
    image_size: int
    #: number of images per epoch in each split
    train_length: int
    val_length: int


@dataclass(frozen=True)
class Shard:
    """This rank's slice of the data: batches are split across ``world_size`` ranks."""

    rank: int = 0
    world_size: int = 1


class Loader(Protocol):
    """A framework-native batch iterator for one split, re-iterable per epoch."""

    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Any, Any]]:
        """Yield ``(images, labels)`` for ``epoch`` (0-based), skipping the first ``start_batch``
        batches so that a run resumed mid-epoch sees exactly the batches it had not yet seen."""


class DataSource(ABC):
    """Produces framework-native batches.

    ``frameworks`` lists the framework names :meth:`loader` supports; selecting another
    combination is reported as a config error before the job starts.
    """

    frameworks: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @property
    @abstractmethod
    def info(self) -> DataInfo: ...

    def prepare(self, run: Run) -> None:
        """Called on every rank before loaders are built: stage files, wait for local rank 0."""

    @abstractmethod
    def loader(self, framework: str, split: Split, *, batch_size: int, shard: Shard, seed: int,
               device: Any = None, channels_last: bool = False) -> Loader:
        """A loader of per-rank batches of ``batch_size`` for ``split``.

        What each ``framework`` expects back (the :class:`Loader` protocol, plus):

        * ``"pytorch"``: ``(images, labels)`` tensors, NCHW float32 (NHWC memory when
          ``channels_last``) on ``device``;
        * ``"tensorflow"`` and ``"keras"``: also ``epoch(epoch, start_batch=0)`` returning a
          ``tf.data.Dataset`` of that epoch's NHWC batches (what ``iter_epoch`` iterates), and a
          ``dataset`` attribute: one epoch as a dataset whose every new iteration is the next
          epoch (what ``model.fit`` trains several epochs on). ``tf.data`` pipelines give the
          strategy and Keras their prefetching; a plain Python iterator would serialise input and
          compute;
        * ``"numpy"``: numpy arrays, NHWC (the test kit's fake framework).
        """
