"""The image-folder loader: which files are images (:func:`is_image`), in which order, with which
augmentation -- and, for consumers without a pipeline of their own (the test kit's fake framework,
a framework plugin that has no native one), numpy batches decoded by a thread pool (Pillow and
simplejpeg release the GIL).

Framework plugins build their own pipeline from its :meth:`~ImageFiles.native_spec`
(``ddlkit_pytorch.imagefolder``: ``DataLoader`` worker processes; ``ddlkit_tensorflow.imagefolder``:
``tf.data``); every pipeline reads the same order (:func:`~ddlkit.images.epoch_order`) and draws the same crops.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import ConfigError
from ..interfaces import Batch, ImageFilesSpec, Shard
from ._decode import MEAN, STD, Augment, CorruptImageError, decode_into, sample_rng
from ._order import epoch_order, num_batches

#: the file name extensions of the images ``data=imagefolder`` reads (any case)
IMAGE_EXTENSIONS = frozenset({".jpeg", ".jpg", ".jpe", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def is_image(name: str) -> bool:
    """Whether a file named ``name`` is an image ``data=imagefolder`` reads (hidden files are not)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS and not name.startswith(".")


class ImageFiles:
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
        local_size: int = 1,
    ) -> None:
        self.files, self.labels, self.aug = files, np.asarray(labels, dtype=np.int64), aug
        self.batch_size, self.shard, self.seed = batch_size, shard, seed
        #: data.workers as configured: -1 lets each pipeline choose (ImageFilesSpec.auto_workers)
        self.workers = workers
        #: ranks on this node, which share its cores
        self.local_size = local_size
        self.on_corrupt = on_corrupt
        self.skip_corrupt = on_corrupt == "skip"
        self.skipped = 0
        self._reported: set[str] = set()
        self.n = num_batches(len(files), batch_size, shard, aug.train)

    def __len__(self) -> int:
        return self.n

    def native_spec(self) -> ImageFilesSpec:
        """The files, order and crops, from which a framework builds its own pipeline."""
        return ImageFilesSpec(
            self.files,
            self.labels,
            self.aug,
            batch_size=self.batch_size,
            shard=self.shard,
            seed=self.seed,
            workers=self.workers,
            on_corrupt=self.on_corrupt,
            local_size=self.local_size,
        )

    def _one(self, epoch: int, index: int, out: np.ndarray) -> int:
        """Decode image ``index`` (or, skipping corrupt files, the next one that decodes) into
        ``out``; returns the label."""
        for j in range(index, index + (len(self.files) if self.skip_corrupt else 1)):
            j %= len(self.files)
            try:
                decode_into(self.files[j], self.aug, sample_rng(self.seed, epoch, j), out)
                return int(self.labels[j])
            except CorruptImageError as err:
                if not self.skip_corrupt:
                    raise
                self.skipped += 1
                if err.path not in self._reported:  # once per file, not once per epoch
                    self._reported.add(err.path)
                    print(
                        f"ddlkit: warning: skipped corrupt image {err.path} ({err.reason}); trained on the next "
                        "image instead",
                        file=sys.stderr,
                        flush=True,
                    )
        raise CorruptImageError(self.files[index], "no image of the split decodes")

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        if self.aug.device_decoding:
            # numpy batches are decoded here, on the CPU: a framework that decodes on its GPU
            # builds its own pipeline from native_spec() and never asks for these
            raise ConfigError(
                "data.decoder=gpu needs a framework whose input pipeline decodes on the GPU "
                "(framework=pytorch); this one takes numpy batches decoded on the CPU: use "
                "data.decoder=auto."
            )
        order = epoch_order(
            len(self.files),
            batch_size=self.batch_size,
            shard=self.shard,
            seed=self.seed,
            epoch=epoch,
            train=self.aug.train,
        )
        b, size = self.batch_size, self.aug.size
        mean, std = np.float32(255) * np.asarray(MEAN, np.float32), np.float32(255) * np.asarray(STD, np.float32)
        with ThreadPoolExecutor(max(1, self.native_spec().auto_workers())) as pool:
            for k in range(start_batch, self.n):
                indices = order[k * b : (k + 1) * b]
                images = np.empty((len(indices), size, size, 3), np.uint8)
                labels = np.fromiter(
                    pool.map(self._one, [epoch] * len(indices), indices.tolist(), list(images)), np.int64, len(indices)
                )
                yield Batch((images.astype(np.float32) - mean) / std, labels)
