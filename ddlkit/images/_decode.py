"""Decoding and augmenting one image (used by the PyTorch and numpy pipelines; TensorFlow's runs
as graph ops in ``ddlkit_tensorflow.imagefolder``).

Speed comes from never decoding more pixels than the output needs: the crop is chosen from the
header first, then JPEGs are decoded with libjpeg-turbo's DCT scaling (``simplejpeg`` when
installed, else Pillow's ``draft``) at the smallest scale that still leaves the crop at least
``size`` pixels on a side. :func:`decode_region` stops there (the PyTorch workers resize with
torch); :func:`decode` crops and resizes in one Pillow call. For decoding on a GPU
(``data.decoder=gpu``), :func:`crop_window` draws the same crop and flip from the header alone and
leaves the decoding to the framework. Anything else
(PNG content behind a ``.JPEG`` name, CMYK, grayscale, palette images) goes through Pillow and
``convert("RGB")``.

Imports numpy (and Pillow, when installed) at module level: import this module only where images
are decoded. Pillow is data=imagefolder's dependency alone: TensorFlow's pipeline decodes without it.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

try:
    from PIL import Image
except ImportError:  # needed only where images are decoded here (the PyTorch and numpy pipelines)
    Image = None

#: how a run that must decode with Pillow, without it, is told what to do
PILLOW_MISSING = (
    "data=imagefolder decodes images with Pillow, which is not installed: pip install pillow "
    "(and simplejpeg for faster JPEG decoding: pip install simplejpeg)"
)

#: ImageNet's per-channel mean and standard deviation (RGB, 0..1)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
RATIO = (3 / 4, 4 / 3)
DECODERS = ("auto", "simplejpeg", "pil", "gpu")
_JPEG_MAGIC = b"\xff\xd8\xff"
#: the end-of-image marker, and how far before a file's end it may be (some writers pad after it)
_JPEG_END, _END_WITHIN = b"\xff\xd9", 1024

try:
    import simplejpeg
except ImportError:  # optional: Pillow decodes everything too, a little slower
    simplejpeg = None


class CorruptImageError(ConfigError):
    """An image file that cannot be read or decoded."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(
            f"cannot decode image {path}: {reason}. Replace or delete the file, or set "
            "data.on_corrupt=skip to train on the others (skipped files are counted and reported)."
        )


def resolve_decoder(name: str) -> str:
    """The CPU decoder for ``data.decoder=name``: with ``gpu``, the one for the files the GPU
    does not take (``Augment.device_decoding``)."""
    if name not in DECODERS:
        raise ConfigError(f"data.decoder={name} is invalid: choose one of {', '.join(DECODERS)}.")
    if name == "simplejpeg" and simplejpeg is None:
        raise ConfigError(
            "data.decoder=simplejpeg but simplejpeg is not installed: pip install simplejpeg "
            "(or use data.decoder=auto)."
        )
    if name in ("auto", "gpu"):
        return "simplejpeg" if simplejpeg is not None else "pil"
    return name


@dataclass(frozen=True)
class Augment:
    """What to do to each image: a random-resized crop + flip (train) or resize + center crop (val)."""

    size: int
    train: bool
    #: validation: the shorter side is resized to this before the center crop
    val_resize: int
    #: train: the crop covers at least this fraction of the image
    min_area: float = 0.08
    #: the CPU decoder (:func:`resolve_decoder`)
    decoder: str = "pil"
    #: colour JPEGs decoded on the training device (data.decoder=gpu; see :func:`crop_window`)
    device_decoding: bool = False


def random_resized_crop(width: int, height: int, rnd: random.Random, min_area: float) -> tuple[int, int, int, int]:
    """(x, y, w, h) of torchvision's RandomResizedCrop with scale=(min_area, 1), ratio=(3/4, 4/3)."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rnd.uniform(min_area, 1.0)
        aspect = math.exp(rnd.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rnd.randint(0, width - w), rnd.randint(0, height - h), w, h
    # fallback: the whole image, clamped to the ratio range, centered
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        w, h = int(round(height * RATIO[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop(width: int, height: int, size: int, resize: int) -> tuple[float, float, float, float]:
    """(x, y, w, h) in the original image of resize-shorter-side-to-``resize`` + center-crop-``size``."""
    side = size * min(width, height) / resize
    return (width - side) / 2, (height - side) / 2, side, side


@dataclass
class Region:
    """A decoded image (possibly DCT-scaled down) and what to make of it."""

    #: a numpy HWC uint8 array (simplejpeg) or an RGB Pillow image
    image: np.ndarray | Image.Image
    #: the crop as (left, top, right, bottom) in ``image``'s pixels, to be resized to size x size
    box: tuple[float, float, float, float]
    flip: bool


def decode_region(path: str, aug: Augment, rnd: random.Random | None) -> Region:
    """Read and decode ``path`` as far as :class:`Augment` needs, and draw its crop and flip.
    Raises :class:`CorruptImageError` for anything that cannot be read or decoded."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise CorruptImageError(path, f"{type(err).__name__}: {err.strerror or err}") from None
    found = None
    if aug.decoder == "simplejpeg" and data[:3] == _JPEG_MAGIC:
        found = _simplejpeg(data, aug, rnd)
    if found is None:
        if Image is None:
            raise ConfigError(PILLOW_MISSING)
        try:
            found = _pil(data, aug, rnd)
        except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError... for bad files
            raise CorruptImageError(path, f"{type(err).__name__}: {err}") from None
    image, box = found
    return Region(image, box, aug.train and rnd is not None and rnd.random() < 0.5)


def decode(path: str, aug: Augment, rnd: random.Random | None) -> np.ndarray:
    """``path`` decoded, cropped, resized (Pillow) and flipped: size x size x 3 uint8."""
    if Image is None:
        raise ConfigError(PILLOW_MISSING)
    region = decode_region(path, aug, rnd)
    image = region.image if isinstance(region.image, Image.Image) else Image.fromarray(region.image)
    arr = np.asarray(image.resize((aug.size, aug.size), Image.Resampling.BILINEAR, box=region.box))
    return arr[:, ::-1] if region.flip else arr


def decode_into(path: str, aug: Augment, rnd: random.Random | None, out: np.ndarray) -> None:
    """:func:`decode` into ``out`` (size x size x 3 uint8)."""
    out[...] = decode(path, aug, rnd)


def _crop_box(width: int, height: int, aug: Augment, rnd: random.Random | None) -> tuple[float, float, float, float]:
    if aug.train:
        return random_resized_crop(width, height, rnd or random.Random(0), aug.min_area)
    return center_crop(width, height, aug.size, aug.val_resize)


def _scaled(
    box: tuple[float, float, float, float], width: int, height: int, decoded_w: int, decoded_h: int
) -> tuple[float, float, float, float]:
    """(x, y, w, h) in original pixels -> (left, top, right, bottom) in the decoded image's."""
    x, y, w, h = box
    sx, sy = width / decoded_w, height / decoded_h
    return x / sx, y / sy, min((x + w) / sx, decoded_w), min((y + h) / sy, decoded_h)


def _simplejpeg(data: bytes, aug: Augment, rnd: random.Random | None) -> tuple[np.ndarray, tuple] | None:
    """The fast path for RGB and grayscale JPEGs; None hands the file to Pillow (CMYK, or an
    error that Pillow then reports in its own words)."""
    state = rnd.getstate() if rnd is not None else None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace not in ("YCbCr", "Gray", "RGB"):
            return None
        box = _crop_box(width, height, aug, rnd)
        # the smallest DCT scale that still leaves the crop at least `size` pixels each way
        min_w, min_h = math.ceil(width * aug.size / box[2]), math.ceil(height * aug.size / box[3])
        arr = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=min(min_w, width), min_height=min(min_h, height))
    except ValueError:
        if rnd is not None and state is not None:
            rnd.setstate(state)  # Pillow draws the same crop
        return None
    return arr, _scaled(box, width, height, arr.shape[1], arr.shape[0])


def _pil(data: bytes, aug: Augment, rnd: random.Random | None) -> tuple[Image.Image, tuple]:
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    box = _crop_box(width, height, aug, rnd)
    if image.format == "JPEG":
        image.draft("RGB", (math.ceil(width * aug.size / box[2]), math.ceil(height * aug.size / box[3])))
    if image.mode.startswith("I"):
        # 16-bit grayscale (PNG, TIFF) opens as I;16 or I: Pillow's convert("RGB") clips every value
        # above 255 to white; keep the high byte, as TensorFlow's decoder does (issue 17, item 20)
        image = Image.fromarray((np.asarray(image, dtype=np.uint32) >> 8).clip(0, 255).astype(np.uint8), "L")
    if image.mode != "RGB":
        image = image.convert("RGB")
    image.load()
    return image, _scaled(box, width, height, image.width, image.height)


#: start-of-frame markers of 8-bit Huffman-coded JPEGs (baseline, extended, progressive)
_HUFFMAN_SOF = (0xC0, 0xC1, 0xC2)
#: every other start-of-frame marker (lossless, hierarchical, arithmetic-coded)
_OTHER_SOF = frozenset(range(0xC3, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_header(data: bytes) -> tuple[int, int, int, bool] | None:
    """``(width, height, components, adobe_rgb)`` of an 8-bit Huffman-coded JPEG, from its
    markers alone (nothing decoded); None for anything else: not a JPEG, a truncated header,
    12-bit, lossless or arithmetic-coded. ``adobe_rgb``: an Adobe marker says the three
    components are RGB, not YCbCr."""
    if data[:3] != _JPEG_MAGIC:
        return None
    adobe_rgb, i, n = False, 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xEE and data[i + 4 : i + 9] == b"Adobe" and i + 15 <= n:
            adobe_rgb = data[i + 15] == 0  # transform 0: the components are not YCbCr
        if marker in _HUFFMAN_SOF:
            if i + 10 > n or data[i + 4] != 8:
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return (width, height, data[i + 9], adobe_rgb) if width and height else None
        if marker in _OTHER_SOF or marker == 0xDA:  # not Huffman-coded 8-bit, or scan data before any frame
            return None
        i += 2 + length
    return None


def crop_window(data: bytes, aug: Augment, rnd: random.Random | None) -> tuple[tuple[int, int, int, int], bool] | None:
    """For decoding on a GPU: the crop of a colour JPEG as ``(left, top, right, bottom)`` in its
    full-size pixels, and the flip -- the same draws as :func:`decode_region` makes -- from the
    header alone. None (drawing nothing) for what the CPU decodes instead: anything but a
    complete three-component YCbCr 8-bit Huffman JPEG (grayscale, CMYK, PNG behind a JPEG name,
    an unreadable header, a file cut short).

    A file cut short is recognised by its missing end-of-image marker: nvJPEG decodes whatever
    scan data there is without a word (seen on an H200), where the CPU's libjpeg reports it."""
    header = jpeg_header(data)
    if header is None or header[2] != 3 or header[3] or data.rfind(_JPEG_END, max(0, len(data) - _END_WITHIN)) < 0:
        return None
    width, height = header[0], header[1]
    x, y, w, h = _crop_box(width, height, aug, rnd)
    left, top = round(x), round(y)
    box = (left, top, max(min(round(x + w), width), left + 1), max(min(round(y + h), height), top + 1))
    return box, aug.train and rnd is not None and rnd.random() < 0.5


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The augmentation randomness of image ``index`` in ``epoch``: the same in every worker,
    process and run, so that a resumed run sees exactly the batches an uninterrupted one would."""
    return random.Random((seed * 1_000_003 + epoch) * 100_000_007 + index)
