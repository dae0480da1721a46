"""Synthetic images that carry their label, served from an in-memory pool (``data=synthetic``'s loader).

Each class has a pattern (a random grid, blown up to the image size); an image is its class's
pattern plus standard normal noise. numpy is imported when the pool is first made.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from ..interfaces import Batch, ImagePoolSpec

#: side of the per-class pattern grid before it is blown up to the image size
PATTERN_GRID = 4


class SyntheticImages:
    """A split's batches: ``len(self)`` per epoch, drawn in turn from a pool of distinct ones.

    Framework adapters may take the pool from :meth:`native_spec` to put it on their device at once."""

    def __init__(
        self,
        *,
        batch_size: int,
        image_size: int,
        num_classes: int,
        batches: int,
        pool_mib: int,
        seed: int,
        stream: tuple[int, ...],
    ) -> None:
        self.batch_size, self.image_size, self.num_classes = batch_size, image_size, num_classes
        #: ``seed`` draws the class patterns, ``(seed, *stream)`` this loader's labels and noise
        self.batches, self.seed, self.stream = batches, seed, stream
        batch_bytes = batch_size * image_size * image_size * 3 * 4
        #: distinct batches generated
        self.pool_size = max(1, min(batches, pool_mib * 2**20 // batch_bytes))
        self._pool: tuple[Any, Any] | None = None
        self._maker: threading.Thread | None = None
        self._error: BaseException | None = None

    def __len__(self) -> int:
        return self.batches

    def start(self) -> SyntheticImages:
        """Make the pool in a background thread; :attr:`pool` waits for it. numpy lets go of the
        interpreter while it draws, so the pool is made while a rank imports its framework (seconds
        of Python on one core): ``data=synthetic``'s ``prepare`` starts its loaders so."""
        if self._pool is None and self._maker is None:
            self._maker = threading.Thread(target=self._make_in_background, name="ddlkit-synthetic-pool", daemon=True)
            self._maker.start()
        return self

    def _make_in_background(self) -> None:
        try:
            self._pool = self._make()
        except BaseException as err:  # raised again where the pool is read
            self._error = err

    @property
    def pool(self) -> tuple[Any, Any]:
        """``(images, labels)``: float32 ``(pool, batch, size, size, 3)`` and int64 ``(pool, batch)``."""
        if self._maker is not None:
            self._maker.join()
            self._maker = None
            if self._error is not None:
                raise self._error
        if self._pool is None:
            self._pool = self._make()
        return self._pool

    def _make(self) -> tuple[Any, Any]:
        import numpy as np

        size, grid = self.image_size, PATTERN_GRID
        patterns = np.random.default_rng(self.seed).standard_normal((self.num_classes, grid, grid, 3), dtype=np.float32)
        block = -(-size // grid)
        rng = np.random.default_rng((self.seed, *self.stream))
        labels = rng.integers(0, self.num_classes, (self.pool_size, self.batch_size))
        images = rng.standard_normal((self.pool_size, self.batch_size, size, size, 3), dtype=np.float32)
        for k in range(self.pool_size):  # a batch at a time: no pool-sized temporary
            images[k] += patterns[labels[k]].repeat(block, axis=1).repeat(block, axis=2)[:, :size, :size]
        return images, labels

    def native_spec(self) -> ImagePoolSpec:
        """The pool, which a framework puts on its device at once."""
        images, labels = self.pool
        return ImagePoolSpec(images, labels, batches=self.batches)

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        pool = self.native_spec()
        for k in range(start_batch, self.batches):
            i = pool.index(epoch, k)
            yield Batch(pool.images[i], pool.labels[i])
