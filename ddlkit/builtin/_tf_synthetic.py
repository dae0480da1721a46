"""TensorFlow half of the synthetic data source (imported only when a TF framework asks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class TfRepeatLoader:
    """One NHWC batch held as constants, served through ``tf.data`` (``.dataset``) or iterated."""

    def __init__(self, images: Any, labels: Any, n: int) -> None:
        import tensorflow as tf

        self.images, self.labels, self.n = images, labels, n
        self.dataset = tf.data.Dataset.from_tensors((images, labels)).repeat(n).prefetch(tf.data.AUTOTUNE)

    def __len__(self) -> int:
        return self.n

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Any, Any]]:
        for _ in range(start_batch, self.n):
            yield self.images, self.labels


def tf_synthetic_loader(batch_size: int, size: int, classes: int, n: int, seed: int, device: Any) -> TfRepeatLoader:
    import tensorflow as tf

    g = tf.random.Generator.from_seed(seed)
    with tf.device(device or "/cpu:0"):
        images = g.normal((batch_size, size, size, 3))
        labels = g.uniform((batch_size,), 0, classes, dtype=tf.int64)
    return TfRepeatLoader(images, labels, n)
