"""The PyTorch side of ddlkit's framework-neutral data: a data source's loader in, ``(inputs,
targets)`` tensors on the run's device out, with the same ``__len__`` / ``iter_epoch``.

A loader that describes its images (:func:`ddlkit.interfaces.data.native_spec`) gets a native
pipeline; any other is served through its numpy batches:

* :class:`~ddlkit.ImageFilesSpec` (``data=imagefolder``): a ``DataLoader`` whose worker processes
  decode whole batches into shared memory (:mod:`.imagefolder`);
* :class:`~ddlkit.ImagePoolSpec` (``data=synthetic``): the whole pool of batches copied to the
  device once, then served as views, so a step costs no data work;
* no description (``data=custom``, a plugin's source): each numpy batch wrapped without a copy
  (``torch.from_numpy``) and moved to the device.

Images (``DataInfo.image_size > 0``) arrive NHWC and leave NCHW: a permuted NHWC array *is* an
NCHW tensor in channels-last memory, so ``framework.channels_last=true`` costs no copy and the
default (contiguous NCHW) one copy per batch, as a ``ToTensor`` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ddlkit import ImageFilesSpec, ImagePoolSpec
from ddlkit.interfaces.data import native_spec


def torch_loader(loader: Any, *, images: bool, device: Any, channels_last: bool) -> Any:
    """``loader`` (a data source's) as a loader of tensors on ``device``; ``images``: its inputs
    are NHWC images."""
    spec = native_spec(loader)
    if isinstance(spec, ImageFilesSpec):
        from .imagefolder import TorchImageLoader

        return TorchImageLoader(
            spec.files,
            spec.labels,
            spec.aug,
            batch_size=spec.batch_size,
            shard=spec.shard,
            seed=spec.seed,
            workers=spec.auto_workers(),
            on_corrupt=spec.on_corrupt,
            device=device,
            channels_last=channels_last,
            auto_workers=spec.workers < 0,
        )
    if isinstance(spec, ImagePoolSpec):
        return PooledLoader(spec, device=device, channels_last=channels_last)
    return NumpyLoader(loader, images=images, device=device, channels_last=channels_last)


def to_torch_images(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """NHWC (or a stack of NHWC batches) -> NCHW, in channels-last memory or contiguous."""
    x = x.movedim(-1, -3)
    return x if channels_last else x.contiguous()


class NumpyLoader:
    """Any framework-neutral loader, batch by batch."""

    def __init__(self, loader: Any, *, images: bool, device: Any, channels_last: bool) -> None:
        self.loader, self.images, self.device, self.channels_last = loader, images, device, channels_last

    def __len__(self) -> int:
        return len(self.loader)

    def convert(self, inputs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.as_tensor(inputs)
        if self.images and x.dim() == 4:
            x = to_torch_images(x, self.channels_last)
        return x.to(self.device, non_blocking=True), torch.as_tensor(targets).to(self.device, non_blocking=True)

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, targets in self.loader.iter_epoch(epoch, start_batch):
            yield self.convert(inputs, targets)


class PooledLoader:
    """A pool of batches (``data=synthetic``'s) on the device, one view per step."""

    def __init__(self, pool: ImagePoolSpec, *, device: Any, channels_last: bool) -> None:
        self.pool = pool
        self.images = to_torch_images(torch.from_numpy(pool.images), channels_last).to(device)
        self.labels = torch.from_numpy(pool.labels).to(device)

    def __len__(self) -> int:
        return self.pool.batches

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for k in range(start_batch, self.pool.batches):
            i = self.pool.index(epoch, k)
            yield self.images[i], self.labels[i]


def probe_inputs(loader: Any, info: Any, *, images: bool, device: Any, channels_last: bool) -> torch.Tensor:
    """Two samples' inputs, on the device, to check a model's output with before training: zeros
    for images (no decoding), else the loader's first two samples."""
    if images:
        x = torch.zeros(2, info.image_size, info.image_size, 3)
        return to_torch_images(x, channels_last).to(device)
    inputs, _ = next(iter(loader.iter_epoch(0)))
    return NumpyLoader(loader, images=False, device=device, channels_last=channels_last).convert(
        inputs[:2], inputs[:2]
    )[0]
