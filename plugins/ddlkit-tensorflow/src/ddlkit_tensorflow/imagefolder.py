"""``data=imagefolder`` for TensorFlow and Keras: ``tf.data`` with parallel decoding in TensorFlow's
own threads, built from the description a loader declares, :class:`~ddlkit.ImageFilesSpec`, by
:func:`ddlkit_tensorflow.data.tf_loader`.

The loader has the shape of every loader of :mod:`ddlkit_tensorflow.data`: ``epoch(e, start_batch)`` is a
``tf.data.Dataset`` of one epoch's batches, ``dataset`` is a dataset each new iteration of which
is the run's current epoch (what ``model.fit`` consumes), ``iter_epoch`` iterates ``epoch``.

Per image: read the file, then for a JPEG decode only the crop window
(``decode_and_crop_jpeg``; the window is drawn from the header alone), for anything else
(PNG content behind a ``.JPEG`` name, BMP, GIF) ``decode_image``; grayscale and CMYK come out
as RGB (``channels=3``). The crop is a stateless function of ``(seed, epoch, image)``, like the
order, so batch ``k`` of an epoch is the same whether or not the run was resumed before it.

Corrupt files: TensorFlow cannot catch an error inside a graph, so the decode errors are dropped
(``ignore_errors``) and the *gap* they leave is detected downstream: every element carries its
position in the epoch, and a sequential ``scan`` compares it with the expected one. A gap means
the files at the missing positions failed; a Python callback names them and either raises
(``on_corrupt=error``: the error is kept in :attr:`TfImageLoader.error`, a short assertion stops
the pipeline, and :func:`ddlkit_tensorflow.data.data_errors` raises the kept error in its place) or
counts them (``skip``), in which case the next image that decoded is
repeated into the empty slots, so batches stay full and the epoch keeps its length. The
positions after the epoch's last image are ``MAX_SUBSTITUTES`` spare images and a sentinel that
never fails, so that a gap at the very end is detected and filled too.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ddlkit.errors import DdlkitError, RunError
from ddlkit.images import MEAN, RATIO, STD, Augment, CorruptImageError, epoch_order, num_batches
from ddlkit.interfaces import Shard

MAX_SUBSTITUTES = 16
#: the message of the assertion that stops a pipeline on a data error (``TfImageLoader.error`` says which)
_STOPPED = "ddlkit: the input pipeline stopped on a data error"
_SEED_STRIDE = 1_000_003


class TfImageLoader:
    def __init__(
        self,
        files: Sequence[str],
        labels: Sequence[int],
        aug: Augment,
        *,
        batch_size: int,
        shard: Shard,
        seed: int,
        workers: int,
        on_corrupt: str,
        pass_epoch: Callable[[], int] | None = None,
    ) -> None:
        self.files = np.array([f.encode() for f in files], dtype=object)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.aug, self.batch_size, self.shard, self.seed = aug, batch_size, shard, seed
        self.parallel = workers if workers > 0 else tf.data.AUTOTUNE
        self.skip_corrupt = on_corrupt == "skip"
        self.skipped = 0
        #: the data error that stopped the pipeline (TensorFlow hands it on wrapped in its own)
        self.error: DdlkitError | None = None
        self._reported: set[str] = set()
        self.n = num_batches(len(self.files), batch_size, shard, aug.train)
        self._passes = 0
        self._pass_epoch = pass_epoch or self._count_passes
        self.dataset = self._next_pass()

    def __len__(self) -> int:
        return self.n

    # ------------------------------------------------------------ which images, in which order
    @functools.lru_cache(maxsize=4)  # noqa: B019 -- a loader lives as long as its run
    def _extended_order(self, epoch: int) -> np.ndarray:
        """The epoch's file indices, then the spares that may stand in for trailing corrupt files."""
        order = epoch_order(
            len(self.files),
            batch_size=self.batch_size,
            shard=self.shard,
            seed=self.seed,
            epoch=epoch,
            train=self.aug.train,
        )
        last = int(order[-1]) if len(order) else -1
        spares = (last + 1 + np.arange(MAX_SUBSTITUTES)) % max(len(self.files), 1)
        return np.concatenate([order, spares]).astype(np.int64)

    def _elements(self, epoch: int, start_batch: int) -> tuple[np.ndarray, ...]:
        """(epoch, position, file index, path, label) of every element from ``start_batch`` on,
        the spares, and the sentinel (empty path)."""
        order = self._extended_order(epoch)
        begin = min(start_batch, self.n) * self.batch_size
        idx = order[begin:]
        positions = np.arange(begin, len(order) + 1, dtype=np.int64)
        paths = np.append(self.files[idx], b"")
        labels = np.append(self.labels[idx], 0)
        indices = np.append(idx, -1)
        return np.full(len(positions), epoch, np.int64), positions, indices, paths, labels

    def _count_passes(self) -> int:
        """Without a run to follow, each new pass over ``dataset`` is the next epoch."""
        self._passes += 1
        return self._passes - 1

    # ------------------------------------------------------------ datasets
    def epoch(self, epoch: int, start_batch: int = 0) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(self._elements(epoch, start_batch))
        begin = min(start_batch, self.n)
        return self._pipeline(ds, self.n - begin, self._slots(epoch), begin * self.batch_size)

    def _slots(self, epoch: int) -> int:
        return len(self._extended_order(epoch)) - MAX_SUBSTITUTES

    def _next_pass(self) -> tf.data.Dataset:
        """Each iteration reads the epoch to serve when it starts (``pass_epoch``): Keras' ``fit``
        iterates one dataset once per epoch."""
        signature = (
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None], tf.string),
            tf.TensorSpec([None], tf.int64),
        )

        def one_pass() -> Iterator[tuple[np.ndarray, ...]]:
            yield self._elements(self._pass_epoch(), 0)

        ds = tf.data.Dataset.from_generator(one_pass, output_signature=signature).unbatch()
        # every epoch has the same number of slots; epoch 0's count stands for all
        return self._pipeline(ds, self.n, self._slots(0), 0)

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Any, Any]]:
        return iter(self.epoch(epoch, start_batch))

    def _pipeline(self, elements: tf.data.Dataset, batches: int, slots: int, begin: int) -> tf.data.Dataset:
        """``elements`` from position ``begin`` on -> normalized batches; ``slots``: the epoch's
        number of images (positions from there on are spares and the sentinel)."""
        decoded = elements.map(self._decode, num_parallel_calls=self.parallel, deterministic=True).ignore_errors()
        filled = decoded.scan(tf.constant(begin, tf.int64), functools.partial(self._check_gap, slots=slots))
        images = filled.flat_map(lambda k, image, label: tf.data.Dataset.from_tensors((image, label)).repeat(k))
        mean = tf.constant(MEAN, tf.float32) * 255
        std = tf.constant(STD, tf.float32) * 255
        batched = images.batch(self.batch_size, drop_remainder=self.aug.train)
        batched = batched.map(lambda x, y: ((x - mean) / std, y), num_parallel_calls=tf.data.AUTOTUNE)
        return batched.prefetch(tf.data.AUTOTUNE).apply(tf.data.experimental.assert_cardinality(batches))

    def _check_gap(self, expected: Any, element: tuple[Any, ...], slots: int) -> tuple[Any, tuple[Any, ...]]:
        """``scan`` step: report the positions between the last element and this one (their files
        failed), and say how many slots this element fills."""
        epoch, pos, image, label = element
        gap = pos - expected
        report = tf.cond(
            gap > 0,
            lambda: tf.numpy_function(self._on_gap, [epoch, expected, pos], tf.int64),
            lambda: tf.constant(0, tf.int64),
        )
        # a Python exception raised inside numpy_function would be logged by TensorFlow with its
        # whole traceback, per thread: the error is kept in self.error instead, and this short
        # assertion stops the pipeline (data_errors() raises self.error in its place)
        stop = tf.debugging.assert_equal(report, tf.constant(0, tf.int64), message=_STOPPED)
        with tf.control_dependencies([report, stop]):
            # a real image fills its own slot and the failed ones before it; a spare fills what is
            # left before the end; the sentinel (a zero image) fills nothing
            remaining = tf.maximum(tf.cast(slots, tf.int64) - expected, 0)
            repeat = tf.where(pos < slots, gap + 1, tf.where(pos < slots + MAX_SUBSTITUTES, remaining, 0))
        return pos + 1, (repeat, image, label)

    def _on_gap(self, epoch: np.int64, first: np.int64, end: np.int64) -> np.int64:
        """Called from the graph with the positions ``first..end-1`` whose files failed (spares
        beyond the epoch's ``slots`` only matter when they leave a slot empty)."""
        order = self._extended_order(int(epoch))
        slots = len(order) - MAX_SUBSTITUTES
        failed = [self.files[order[p]].decode() for p in range(int(first), min(int(end), slots))]
        if not failed:
            return np.int64(0)
        if int(end) >= len(order):  # reached the sentinel: every spare failed too
            self.error = RunError(
                f"{len(failed) + MAX_SUBSTITUTES} images in a row failed to decode, from "
                f"{failed[0]}: is the dataset readable?",
                component="data",
            )
            return np.int64(1)
        if not self.skip_corrupt:
            self.error = CorruptImageError(failed[0], "TensorFlow could not read or decode it")
            return np.int64(1)
        self.skipped += len(failed)
        for path in failed:
            if path not in self._reported:  # once per file, not once per epoch
                self._reported.add(path)
                print(
                    f"ddlkit: warning: skipped corrupt image {path}; trained on the next image instead "
                    f"({len(self._reported)} corrupt files so far)",
                    file=sys.stderr,
                    flush=True,
                )
        return np.int64(0)

    # ------------------------------------------------------------ one image
    def _decode(self, epoch: Any, pos: Any, index: Any, path: Any, label: Any) -> tuple[Any, ...]:
        size = self.aug.size
        image = tf.cond(
            tf.equal(path, ""),
            lambda: tf.zeros([size, size, 3], tf.float32),
            lambda: self._load(path, tf.stack([epoch + self.seed * _SEED_STRIDE, index])),
        )
        return epoch, pos, image, label

    def _load(self, path: Any, seed: Any) -> Any:
        data = tf.io.read_file(path)
        size = self.aug.size
        if self.aug.train:

            def window(shape: Any) -> Any:
                begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
                    shape,
                    tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
                    seed=seed,
                    min_object_covered=0.0,
                    aspect_ratio_range=RATIO,
                    area_range=(self.aug.min_area, 1.0),
                    max_attempts=10,
                    use_image_if_no_bounding_boxes=True,
                )
                return tf.stack([begin[0], begin[1], extent[0], extent[1]])
        else:

            def window(shape: Any) -> Any:
                side = tf.cast(
                    tf.round(size * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32) / self.aug.val_resize), tf.int32
                )
                side = tf.minimum(side, tf.minimum(shape[0], shape[1]))
                return tf.stack([(shape[0] - side) // 2, (shape[1] - side) // 2, side, side])

        def jpeg() -> Any:
            return tf.image.decode_and_crop_jpeg(data, window(tf.image.extract_jpeg_shape(data)), channels=3)

        def other() -> Any:
            full = tf.io.decode_image(data, channels=3, expand_animations=False)
            w = window(tf.shape(full))
            return tf.slice(full, [w[0], w[1], 0], [w[2], w[3], 3])

        crop = tf.cond(tf.io.is_jpeg(data), jpeg, other)
        image = tf.image.resize(crop, [size, size], method="bilinear")
        if self.aug.train:
            image = tf.image.stateless_random_flip_left_right(image, seed=seed)
        return tf.ensure_shape(image, [size, size, 3])
