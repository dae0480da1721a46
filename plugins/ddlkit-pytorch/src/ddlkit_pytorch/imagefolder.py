"""``data=imagefolder`` for PyTorch: a ``DataLoader`` whose worker processes each decode a whole
batch, built from the description a loader declares, :class:`~ddlkit.ImageFilesSpec` (which files,
in which order, which crops), by :func:`ddlkit_pytorch.data.torch_loader`.

Workers write each batch straight into one shared-memory tensor (no per-image tensors, no
collate copy). Where the normalization happens depends on the device: for a CPU run the workers
normalize each image while it is still in cache and hand over float32 NCHW (in the requested
memory format), so the training process, which shares the cores, does nothing but train; for a
GPU run they hand over uint8 NHWC (a quarter of the bytes to copy to the device) and the GPU
normalizes, where it costs nothing. Workers persist across epochs; the sampler is re-read at
each ``iter_epoch``, so an epoch's order and its starting batch can change without restarting
them.

A file that cannot be decoded is reported by the worker as data, not raised from it, so the
error names the file instead of arriving wrapped in a worker traceback; with
``on_corrupt=skip`` the next image of the split (that decodes) takes its place, which keeps
every batch full and the epoch's batch count, and so resumption, exact.

With ``data.decoder=gpu`` the workers hand over each batch's JPEG
files undecoded, with their crops, and the rank decodes them on its GPU (:mod:`.gpu_decode`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ddlkit.errors import RunError
from ddlkit.images import (
    MEAN,
    STD,
    Augment,
    CorruptImageError,
    crop_window,
    decode_region,
    epoch_order,
    num_batches,
    sample_rng,
)
from ddlkit.interfaces import Shard

from .gpu_decode import DecodeJpegs, DeviceDecoder, Encoded, gpu_decoder, prefetched

#: how many following images are tried in place of a corrupt one (on_corrupt=skip)
MAX_SUBSTITUTES = 16
#: loader workers where the GPU decodes (data.workers=-1): they only read files and parse headers
GPU_DECODE_WORKERS = 4

BatchKey = tuple[int, tuple[int, ...]]


class _BatchDataset(Dataset):
    """Item = a whole batch: ``(epoch, indices)`` -> ``(images, labels, [(path, reason)], complete)``.

    ``normalize``: float32 NCHW normalized images (channels-last in memory if ``channels_last``),
    else uint8 NHWC; ``encoded``: the colour JPEGs' files and crops instead, for the GPU to decode
    (an :class:`~.gpu_decode.Encoded` batch).
    """

    def __init__(
        self,
        files: Sequence[str],
        labels: Sequence[int],
        aug: Augment,
        seed: int,
        skip_corrupt: bool,
        normalize: bool,
        channels_last: bool,
        encoded: bool = False,
    ) -> None:
        # one numpy array, not a list of 1.3 million str objects: forked workers would touch (and
        # so copy) every page of the list just by reference-counting its items
        self.files = np.array([f.encode() for f in files])
        self.labels = np.asarray(labels, dtype=np.int64)
        self.aug, self.seed, self.skip_corrupt = aug, seed, skip_corrupt
        self.normalize, self.channels_last, self.encoded = normalize, channels_last, encoded
        self.inv_std = 1 / (torch.tensor(STD).view(3, 1, 1) * 255)
        self.shift = torch.tensor(MEAN).view(3, 1, 1) * 255 * self.inv_std

    def __len__(self) -> int:
        return len(self.files)

    def _allocate(self, n: int) -> torch.Tensor:
        size = self.aug.size
        if not self.normalize:
            images = torch.empty((n, size, size, 3), dtype=torch.uint8)
        elif self.channels_last:
            images = torch.empty((n, size, size, 3), dtype=torch.float32).permute(0, 3, 1, 2)
        else:
            images = torch.empty((n, 3, size, size), dtype=torch.float32)
        if get_worker_info() is not None:
            images.share_memory_()  # the main process maps it instead of receiving a copy
        return images

    def _image(self, path: str, epoch: int, index: int) -> torch.Tensor:
        """One image, cropped, resized, flipped: uint8 CHW (an HWC array viewed as CHW).

        The resize is torch's antialiased bilinear on uint8 (AVX2), the same filter as Pillow's
        but about twice as fast, straight from the decoded array: no copy into a Pillow image."""
        region = decode_region(path, self.aug, sample_rng(self.seed, epoch, index))
        # a Pillow image (the fallback decoder) is copied into a writable array
        arr = region.image if isinstance(region.image, np.ndarray) else np.array(region.image)
        left, top, right, bottom = (round(v) for v in region.box)
        x = torch.from_numpy(arr[top : max(bottom, top + 1), left : max(right, left + 1)]).permute(2, 0, 1)
        size = self.aug.size
        if x.shape[1:] != (size, size):
            x = torch.nn.functional.interpolate(x[None], size=(size, size), mode="bilinear", antialias=True)[0]
        return x.flip(2) if region.flip else x

    def _substituted(self, epoch: int, indices: Sequence[int], take: Any) -> tuple[torch.Tensor, list, bool]:
        """``take(i, j)`` for each image ``i`` of the batch with the image ``j`` that stands for it
        (itself, or with on_corrupt=skip the next that decodes): labels, errors, complete."""
        labels = torch.empty(len(indices), dtype=torch.int64)
        errors: list[tuple[str, str]] = []
        for i, index in enumerate(indices):
            for attempt in range(MAX_SUBSTITUTES if self.skip_corrupt else 1):
                j = (index + attempt) % len(self.files)
                try:
                    take(i, j)
                except CorruptImageError as err:
                    errors.append((err.path, err.reason))
                    continue
                labels[i] = int(self.labels[j])
                break
            else:
                return labels, errors, False
        return labels, errors, True

    def __getitem__(self, key: BatchKey) -> tuple[Any, torch.Tensor, list[tuple[str, str]], bool]:
        epoch, indices = key
        if self.encoded:
            return self._encoded_batch(epoch, indices)
        images = self._allocate(len(indices))

        def take(i: int, j: int) -> None:
            x = self._image(self.files[j].decode(), epoch, j)
            if self.normalize:  # (x - mean) / std as x * (1/std) - mean/std
                torch.sub(x.float().mul_(self.inv_std), self.shift, out=images[i])
            else:
                images[i].copy_(x.permute(1, 2, 0))

        labels, errors, complete = self._substituted(epoch, indices, take)
        return images, labels, errors, complete

    def _encoded_batch(self, epoch: int, indices: Sequence[int]) -> tuple[Encoded, torch.Tensor, list, bool]:
        n = len(indices)
        files: list[bytes] = [b""] * n
        boxes = torch.zeros((n, 4), dtype=torch.int64)
        flips = torch.zeros(n, dtype=torch.bool)
        where = torch.full((n,), -1, dtype=torch.int64)
        used = torch.empty(n, dtype=torch.int64)
        decoded: list[torch.Tensor] = []

        def take(i: int, j: int) -> None:
            path = self.files[j].decode()
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as err:
                raise CorruptImageError(path, f"{type(err).__name__}: {err.strerror or err}") from None
            window = crop_window(data, self.aug, sample_rng(self.seed, epoch, j))
            if window is None:  # not a colour JPEG (or no readable header): the CPU decodes it
                decoded.append(self._image(path, epoch, j).permute(1, 2, 0))
                where[i] = len(decoded) - 1
                files[i] = b""
            else:
                files[i], where[i] = data, -1
                boxes[i] = torch.tensor(window[0])
                flips[i] = window[1]
            used[i] = j

        labels, errors, complete = self._substituted(epoch, indices, take)
        sizes = torch.tensor([0] + [len(f) for f in files], dtype=torch.int64)
        data = (
            torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8)
            if sizes.sum()
            else torch.empty(0, dtype=torch.uint8)
        )
        size = self.aug.size
        stacked = torch.stack(decoded) if decoded else torch.empty((0, size, size, 3), dtype=torch.uint8)
        if get_worker_info() is not None:
            data.share_memory_()  # the main process maps the batch's files instead of receiving a copy
        return Encoded(data, sizes.cumsum(0), boxes, flips, stacked, where, used, epoch), labels, errors, complete

    def cpu_image(self, index: int, epoch: int) -> tuple[torch.Tensor | None, int, list[tuple[str, str]]]:
        """Image ``index`` decoded on the CPU in the calling process (uint8 CHW), or with
        on_corrupt=skip the next that decodes: the image (None if none did), its label and the
        files that failed."""
        found: list[torch.Tensor] = []
        labels, errors, complete = self._substituted(
            epoch, [index], lambda i, j: found.append(self._image(self.files[j].decode(), epoch, j))
        )
        return (found[0], int(labels[0]), errors) if complete else (None, -1, errors)


class _EpochSampler:
    """Yields the ``(epoch, indices)`` keys of one epoch from ``start`` on; set before each pass."""

    def __init__(self, n: int, batch_size: int, shard: Shard, seed: int, train: bool) -> None:
        self.n, self.batch_size, self.shard, self.seed, self.train = n, batch_size, shard, seed, train
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return num_batches(self.n, self.batch_size, self.shard, self.train) - self.start

    def __iter__(self) -> Iterator[BatchKey]:
        order = epoch_order(
            self.n, batch_size=self.batch_size, shard=self.shard, seed=self.seed, epoch=self.epoch, train=self.train
        )
        b = self.batch_size
        for k in range(self.start, num_batches(self.n, b, self.shard, self.train)):
            yield self.epoch, tuple(int(i) for i in order[k * b : (k + 1) * b])


class TorchImageLoader:
    """``decode_jpegs``: how to decode JPEG files on the device (default: nvJPEG where
    ``aug.device_decoding`` asks for it)."""

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
        device: Any = None,
        channels_last: bool = False,
        decode_jpegs: DecodeJpegs | None = None,
        auto_workers: bool = False,
    ) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.channels_last = channels_last
        self.skip_corrupt = on_corrupt == "skip"
        self.skipped = 0
        self._reported: set[str] = set()
        self.sampler = _EpochSampler(len(files), batch_size, shard, seed, aug.train)
        self._n = len(self.sampler)
        if decode_jpegs is None and aug.device_decoding:
            decode_jpegs = gpu_decoder(self.device)
        #: "gpu" where the device decodes the JPEGs, else the CPU decoder
        self.decoder = "gpu" if decode_jpegs is not None else aug.decoder
        if decode_jpegs is not None and auto_workers:
            workers = min(workers, GPU_DECODE_WORKERS)
        # on a CPU the workers normalize (in parallel); a GPU gets uint8 and normalizes itself
        self.on_device_normalize = self.device.type != "cpu"
        self.dataset = _BatchDataset(
            files,
            labels,
            aug,
            seed,
            self.skip_corrupt,
            normalize=not self.on_device_normalize,
            channels_last=channels_last,
            encoded=decode_jpegs is not None,
        )
        self.device_decoder = (
            None
            if decode_jpegs is None
            else DeviceDecoder(aug.size, self.device, channels_last, decode_jpegs, self._cpu_image)
        )
        self.loader = DataLoader(
            self.dataset,
            batch_size=None,
            sampler=self.sampler,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=self.device.type == "cuda",
        )
        shape = (1, 3, 1, 1)
        self.mean = torch.tensor(MEAN, device=self.device).view(shape) * 255
        self.inv_std = 1 / (torch.tensor(STD, device=self.device).view(shape) * 255)

    def __len__(self) -> int:
        return self._n

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.epoch, self.sampler.start = epoch, min(start_batch, self._n)
        if self.device_decoder is not None:
            yield from prefetched(self._device_decoded, self.device)
            return
        for images, labels, errors, complete in self.loader:
            if errors:
                self._report(errors, complete)
            images = self._normalize(images) if self.on_device_normalize else images
            yield images, labels.to(self.device, non_blocking=True)

    def _device_decoded(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch, labels, errors, complete in self.loader:
            if errors:
                self._report(errors, complete)
            images = self.device_decoder(batch, labels)
            yield images, labels.to(self.device, non_blocking=True)

    def _cpu_image(self, index: int, epoch: int) -> tuple[torch.Tensor, int]:
        """Image ``index`` decoded here on the CPU, where nvJPEG failed on it."""
        image, label, errors = self.dataset.cpu_image(index, epoch)
        if errors:
            self._report(errors, complete=image is not None)
        return image, label

    @property
    def decoded_counts(self) -> dict[str, int]:
        """Images decoded so far on the GPU and on the CPU (data.decoder=gpu)."""
        d = self.device_decoder
        return {} if d is None else {"gpu_decoded_images": d.gpu_decoded, "cpu_decoded_images": d.cpu_decoded}

    def _report(self, errors: list[tuple[str, str]], complete: bool) -> None:
        if not self.skip_corrupt:
            raise CorruptImageError(*errors[0])
        if not complete:
            raise RunError(
                f"{MAX_SUBSTITUTES} images in a row failed to decode, {errors[0][0]} to {errors[-1][0]} "
                f"({errors[0][1]}): is the dataset readable?",
                component="data",
            )
        for path, reason in errors:
            self.skipped += 1
            if path not in self._reported:  # once per file, not once per epoch
                self._reported.add(path)
                print(
                    f"ddlkit: warning: skipped corrupt image {path} ({reason}); trained on the next image instead "
                    f"({len(self._reported)} corrupt files so far)",
                    file=sys.stderr,
                    flush=True,
                )

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 NHWC -> normalized float NCHW on the device (NHWC permuted *is* channels-last)."""
        x = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2)
        x = x.float().sub_(self.mean).mul_(self.inv_std)
        return x if self.channels_last else x.contiguous()
