"""TensorFlow half of the synthetic data source (imported only when a TF framework asks).

A TensorFlow loader is a :class:`ddlkit.Loader` whose batches come from ``tf.data``, so the
training loop never waits on a Python generator:

* ``loader.epoch(epoch, start_batch=0)``: a ``tf.data.Dataset`` of that epoch's batches,
  without the first ``start_batch`` (a run resumed mid-epoch sees only the batches it missed);
* ``loader.dataset``: one epoch as a ``tf.data.Dataset`` to hand to ``model.fit`` (each new
  iteration is the next epoch);
* ``loader.iter_epoch(epoch, start_batch)``: a ``tf.data`` iterator over ``epoch(...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class TfRepeatLoader:
    """One NHWC batch held as a constant and served ``n`` times per epoch through ``tf.data``."""

    def __init__(self, images: Any, labels: Any, n: int) -> None:
        import tensorflow as tf

        self.n = n
        self._batch = tf.data.Dataset.from_tensors((images, labels))
        self.dataset = self.epoch(0)

    def __len__(self) -> int:
        return self.n

    def epoch(self, epoch: int, start_batch: int = 0) -> Any:
        import tensorflow as tf

        # every epoch serves the same batch, so ``epoch`` changes nothing here; prefetching
        # overlaps handing out the next batch with the current step
        return self._batch.repeat(max(self.n - start_batch, 0)).prefetch(tf.data.AUTOTUNE)

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Any, Any]]:
        return iter(self.epoch(epoch, start_batch))


def tf_synthetic_loader(batch_size: int, size: int, classes: int, n: int, seed: int, device: Any) -> TfRepeatLoader:
    import tensorflow as tf

    g = tf.random.Generator.from_seed(seed)
    with tf.device(device or "/cpu:0"):
        images = g.normal((batch_size, size, size, 3))
        labels = g.uniform((batch_size,), 0, classes, dtype=tf.int64)
    return TfRepeatLoader(images, labels, n)
