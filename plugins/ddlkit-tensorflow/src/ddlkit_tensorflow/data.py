"""The TensorFlow / Keras side of ddlkit's framework-neutral data: a data source's loader in, a
``tf.data`` loader out, so the training loop never waits on Python. Every loader made here has

* ``epoch(epoch, start_batch=0)``: a ``tf.data.Dataset`` of that epoch's batches, without the
  first ``start_batch`` (a run resumed mid-epoch sees only the batches it missed);
* ``dataset``: one epoch as a dataset whose every new iteration is the run's current epoch
  (``pass_epoch()``), what ``model.fit`` trains several epochs on;
* ``iter_epoch(epoch, start_batch)`` over ``epoch(...)``, and ``len()``.

A loader that describes its images (:func:`ddlkit.interfaces.data.native_spec`) gets a native
pipeline; any other is served through its numpy batches:

* :class:`~ddlkit.ImageFilesSpec` (``data=imagefolder``): decoding in ``tf.data``'s threads
  (:mod:`.imagefolder`);
* :class:`~ddlkit.ImagePoolSpec` (``data=synthetic``): the pool of batches held by ``tf.data``
  once and served from its cache, no per-step work;
* no description (``data=custom``, a plugin's source): ``Dataset.from_generator`` over its
  numpy batches, prefetched.

Batches are NHWC, as the neutral ones are: nothing to convert.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from ddlkit import ImageFilesSpec, ImagePoolSpec
from ddlkit.interfaces.data import native_spec


def tf_loader(loader: Any, *, pass_epoch: Callable[[], int] | None = None) -> Any:
    """``loader`` (a data source's) as a ``tf.data`` loader; ``pass_epoch``: which epoch a new pass
    over ``dataset`` serves (default: the passes count the epochs)."""
    spec = native_spec(loader)
    if isinstance(spec, ImageFilesSpec):
        from .imagefolder import TfImageLoader

        # data.workers as configured: -1 leaves the decoding threads to tf.data's autotuning
        return TfImageLoader(
            spec.files,
            spec.labels,
            spec.aug,
            batch_size=spec.batch_size,
            shard=spec.shard,
            seed=spec.seed,
            workers=spec.workers,
            on_corrupt=spec.on_corrupt,
            pass_epoch=pass_epoch,
        )
    if isinstance(spec, ImagePoolSpec):
        return PooledLoader(spec, pass_epoch)
    return NumpyLoader(loader, pass_epoch)


class _Passes:
    """Counts the passes over ``dataset`` when no run says which epoch it is."""

    def __init__(self) -> None:
        self.passes = 0

    def __call__(self) -> int:
        self.passes += 1
        return self.passes - 1


class _Loader:
    def __init__(self, n: int, pass_epoch: Callable[[], int] | None) -> None:
        self.n = n
        self._pass_epoch = pass_epoch or _Passes()

    def __len__(self) -> int:
        return self.n

    def epoch(self, epoch: int, start_batch: int = 0) -> tf.data.Dataset:
        return self._batches(lambda: (epoch, start_batch), self.n - min(start_batch, self.n))

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Any, Any]]:
        return iter(self.epoch(epoch, start_batch))

    def _batches(self, which: Callable[[], tuple[int, int]], count: int) -> tf.data.Dataset:
        raise NotImplementedError


class NumpyLoader(_Loader):
    """Any framework-neutral loader, through ``Dataset.from_generator``."""

    def __init__(self, loader: Any, pass_epoch: Callable[[], int] | None) -> None:
        super().__init__(len(loader), pass_epoch)
        self.loader = loader
        # the element spec from the first batch: dtypes and per-sample shapes (the batch may vary)
        first = next(iter(loader.iter_epoch(0)))
        self.signature = tuple(tf.TensorSpec((None, *np.shape(a)[1:]), tf.as_dtype(np.asarray(a).dtype)) for a in first)
        self.dataset = self._batches(lambda: (self._pass_epoch(), 0), self.n)

    def _batches(self, which: Callable[[], tuple[int, int]], count: int) -> tf.data.Dataset:
        def batches() -> Iterator[tuple[Any, ...]]:
            yield from (tuple(b) for b in self.loader.iter_epoch(*which()))

        ds = tf.data.Dataset.from_generator(batches, output_signature=self.signature)
        return ds.prefetch(tf.data.AUTOTUNE).apply(tf.data.experimental.assert_cardinality(count))


class PooledLoader(_Loader):
    """A pool of batches (``data=synthetic``'s) cached by ``tf.data``, each epoch a window of the
    repeated pool."""

    def __init__(self, spec: ImagePoolSpec, pass_epoch: Callable[[], int] | None) -> None:
        super().__init__(spec.batches, pass_epoch)
        self.spec = spec
        self.pool = tf.data.Dataset.from_tensor_slices((spec.images, spec.labels)).cache()
        self.dataset = self._batches(lambda: (self._pass_epoch(), 0), self.n)

    def _batches(self, which: Callable[[], tuple[int, int]], count: int) -> tf.data.Dataset:
        def first() -> Iterator[int]:
            yield self.spec.index(*which())  # once per pass: where in the pool it starts

        start = tf.data.Dataset.from_generator(first, output_signature=tf.TensorSpec((), tf.int64))
        ds = start.flat_map(lambda k: self.pool.repeat().skip(k).take(count))
        return ds.prefetch(tf.data.AUTOTUNE).apply(tf.data.experimental.assert_cardinality(count))


@contextlib.contextmanager
def data_errors(*loaders: Any) -> Iterator[None]:
    """Raise a loader's own error (a corrupt image, named, with the fix) instead of the
    ``tf.errors`` wrapper -- a Python traceback from inside ``tf.numpy_function`` -- that reaches
    the training loop when a pipeline stops on it (issue 17, item 21)."""
    try:
        yield
    except tf.errors.OpError:
        for loader in loaders:
            error = getattr(loader, "error", None)
            if error is not None:
                raise error from None
        raise
