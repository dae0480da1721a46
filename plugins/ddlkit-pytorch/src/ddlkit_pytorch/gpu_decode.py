"""``data.decoder=gpu``: JPEGs decoded on the rank's GPU with nvJPEG (through torchvision), so that
a compiled model on a fast GPU is not held back by CPU decoding.

The split of the work:

* the loader's worker processes read each file's bytes and draw its crop and flip from the JPEG
  header (:func:`ddlkit.images.crop_window`: the same draws as the CPU path makes, so a resumed
  run and the other decoders see the same crops); what nvJPEG should not decode -- grayscale,
  CMYK, PNG behind a JPEG name, anything whose header does not parse -- they decode on the CPU as
  usual (:class:`Encoded`'s ``decoded``);
* the rank decodes the batch's colour JPEGs in one batched nvJPEG call (the A100's and H100's
  hardware JPEG engines for baseline files, so little of it runs on the GPU's cores), then crops,
  resizes (bilinear, antialiased: the CPU path's filter), flips and normalizes on the GPU, in the
  model's memory format;
* :func:`prefetched` does that in a thread of its own on a CUDA stream of its own, one batch or
  two ahead of training, so decoding overlaps the previous step; the training stream waits for
  the batch's event, never for the whole device.

A file nvJPEG refuses after its header parsed (a corrupt body, an unusual subsampling) is decoded
again on the CPU in the rank, with ``data.on_corrupt`` deciding what happens if that fails too.
"""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from ddlkit.errors import ConfigError
from ddlkit.images import MEAN, STD

#: decodes a list of JPEG files (uint8 CPU tensors) into CHW uint8 RGB tensors on the device
DecodeJpegs = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


class Encoded(NamedTuple):
    """A batch as the loader's workers hand it to a rank that decodes on its GPU."""

    #: uint8: the files GPU-decoded, one after another; file k is data[offsets[k]:offsets[k + 1]]
    data: torch.Tensor
    #: int64 (n + 1); a CPU-decoded image's file is empty
    offsets: torch.Tensor
    #: int64 (n, 4): the crop as (left, top, right, bottom) in the file's full-size pixels
    boxes: torch.Tensor
    #: bool (n): flip horizontally (after the crop)
    flips: torch.Tensor
    #: uint8 (m, size, size, 3): the images the workers decoded on the CPU, cropped and flipped
    decoded: torch.Tensor
    #: int64 (n): each image's row in ``decoded``, or -1 where the GPU decodes it
    where: torch.Tensor
    #: int64 (n): which image of the split each one is (after on_corrupt=skip's substitutes)
    indices: torch.Tensor
    epoch: int


def nvjpeg(device: torch.device) -> DecodeJpegs:
    """torchvision's batched nvJPEG decoding on ``device``, tried once on a small JPEG; raises
    :class:`ConfigError` saying why it cannot be used here."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as err:  # not installed, or built for another torch (RuntimeError from its ops)
        raise ConfigError(
            f"data.decoder=gpu decodes with torchvision's nvJPEG, and torchvision cannot be imported "
            f"({type(err).__name__}: {err}): pip install the torchvision built for the installed torch "
            f"{torch.__version__}, or use data.decoder=auto."
        ) from None

    def decode(files: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        return decode_jpeg(files, mode=ImageReadMode.RGB, device=device)

    from PIL import Image

    probe = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 100, 50)).save(probe, "JPEG")
    try:
        decode([torch.frombuffer(bytearray(probe.getvalue()), dtype=torch.uint8)])
    except Exception as err:
        raise ConfigError(
            f"data.decoder=gpu: torchvision cannot decode JPEGs on {device} ({type(err).__name__}: "
            f"{str(err).strip()[:300]}); use data.decoder=auto."
        ) from None
    return decode


def gpu_decoder(device: torch.device) -> DecodeJpegs:
    """data.decoder=gpu's decoder on ``device``; a :class:`ConfigError` where there is none."""
    if device.type != "cuda":
        raise ConfigError(
            f"data.decoder=gpu needs a CUDA GPU, and this rank trains on {device}: use "
            "framework.device=cuda on a machine with one, or data.decoder=auto."
        )
    return nvjpeg(device)


class DeviceDecoder:
    """Turns an :class:`Encoded` batch into normalized float images on the GPU (see the module
    docstring). ``cpu_image(index, epoch) -> (uint8 CHW image, label)`` decodes one image on the CPU
    where nvJPEG failed (and raises what ``data.on_corrupt`` says for a file nothing decodes)."""

    def __init__(
        self,
        size: int,
        device: torch.device,
        channels_last: bool,
        decode_jpegs: DecodeJpegs,
        cpu_image: Callable[[int, int], tuple[torch.Tensor, int]],
    ) -> None:
        self.size, self.device, self.decode_jpegs, self.cpu_image = size, device, decode_jpegs, cpu_image
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.inv_std = 1 / (torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255)
        #: images decoded on the device, and on the CPU (by the workers or, after nvJPEG failed, here)
        self.gpu_decoded = self.cpu_decoded = 0

    def __call__(self, batch: Encoded, labels: torch.Tensor) -> torch.Tensor:
        """The batch's images; ``labels`` is updated where a substitute replaced a corrupt file."""
        n, s = len(batch.where), self.size
        out = torch.empty((n, 3, s, s), dtype=torch.float32, device=self.device, memory_format=self.memory_format)
        where, offsets, boxes = batch.where.tolist(), batch.offsets.tolist(), batch.boxes.tolist()
        on_gpu = [k for k in range(n) if where[k] < 0]
        flip = batch.flips.tolist()
        flipped, retry = [], []
        decoded = self._decode([batch.data[offsets[k] : offsets[k + 1]] for k in on_gpu])
        for k, image in zip(on_gpu, decoded, strict=True):
            left, top, right, bottom = boxes[k]
            if image is None or image.shape[0] != 3 or right > image.shape[2] or bottom > image.shape[1]:
                retry.append(k)  # nvJPEG failed, or the image is not what its header said
                continue
            self._resize_into(out[k], image[:, top:bottom, left:right])
            if flip[k]:
                flipped.append(k)
        if flipped:
            rows = torch.tensor(flipped, device=self.device)
            out[rows] = out[rows].flip(3)
        if len(on_gpu) < n:  # the workers' CPU-decoded images (already cropped, resized and flipped)
            rows = [k for k in range(n) if where[k] >= 0]
            decoded = batch.decoded.to(self.device, non_blocking=True)[[where[k] for k in rows]]
            out[torch.tensor(rows, device=self.device)] = decoded.permute(0, 3, 1, 2).float()
        for k in retry:
            image, labels[k] = self.cpu_image(int(batch.indices[k]), batch.epoch)
            out[k] = image.to(self.device, non_blocking=True).float()
        self.gpu_decoded += len(on_gpu) - len(retry)
        self.cpu_decoded += n - len(on_gpu) + len(retry)
        return out.sub_(self.mean).mul_(self.inv_std)

    def _decode(self, files: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """One batched call; if it fails, each file alone (None for the files that fail again)."""
        if not files:
            return []
        try:
            return list(self.decode_jpegs(files))
        except RuntimeError:
            pass
        decoded: list[torch.Tensor | None] = []
        for f in files:
            try:
                decoded.append(self.decode_jpegs([f])[0])
            except RuntimeError:
                decoded.append(None)
        return decoded

    def _resize_into(self, out: torch.Tensor, crop: torch.Tensor) -> None:
        """``crop`` (uint8 CHW) resized to size x size into ``out``: torch's antialiased bilinear,
        the filter the CPU path uses (and Pillow's)."""
        x = crop.unsqueeze(0).float()
        if x.shape[-2:] != (self.size, self.size):
            x = torch.nn.functional.interpolate(
                x, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False
            )
        out.copy_(x[0])


_END = object()


def prefetched(
    batches: Callable[[], Iterator[tuple[torch.Tensor, ...]]], device: torch.device, depth: int = 2
) -> Iterator[tuple[torch.Tensor, ...]]:
    """The tensors ``batches()`` yields, made ``depth`` batches ahead in a thread of its own (on a
    CUDA device: on a stream of its own, each batch handed over with an event that the consumer's
    stream waits for, and recorded on that stream so that its memory is not reused too early).
    Closing the iterator stops the thread before it returns: the next epoch's may use the same
    loader."""
    cuda = device.type == "cuda"
    if cuda and device.index is None:  # the thread must name the GPU the training thread uses
        device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.Stream(device) if cuda else None
    handed: queue.Queue[tuple[Any, Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[Any, Any, BaseException | None]) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                handed.put(item, timeout=0.1)
                return True
        return False

    def produce() -> None:
        try:
            if cuda:
                torch.cuda.set_device(device)
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                for item in batches():
                    event = None
                    if cuda:
                        event = torch.cuda.Event()
                        event.record(stream)
                    if not put((item, event, None)):
                        return
        except BaseException as err:  # handed to the consumer, which raises it in the training thread
            put((None, None, err))
            return
        put((_END, None, None))

    thread = threading.Thread(target=produce, name="ddlkit-gpu-decode", daemon=True)
    thread.start()
    try:
        while True:
            item, event, err = handed.get()
            if err is not None:
                raise err
            if item is _END:
                return
            if cuda:
                current = torch.cuda.current_stream(device)
                current.wait_event(event)
                for tensor in item:
                    tensor.record_stream(current)
            yield item
    finally:
        stop.set()
        thread.join()
