"""The SDK for framework plugins' image pipelines: what ``data=imagefolder`` and ``data=synthetic`` serve, and how.

A framework plugin that builds its own input pipeline from a loader's native description
(:func:`ddlkit.interfaces.data.native_spec` -> :class:`ddlkit.ImageFilesSpec` or
:class:`ddlkit.ImagePoolSpec`) uses these so that every framework reads the same images in the
same order with the same crops, and a resumed epoch continues exactly:

* files -- :func:`is_image` (which names are images: :data:`IMAGE_EXTENSIONS`);
* order -- :func:`epoch_order` (which images a rank reads in an epoch: a fresh shuffle per epoch,
  disjoint shards, the same number of batches on every rank) and :func:`num_batches`;
* decoding and augmentation -- :class:`Augment` (random-resized crop + flip for training, resize
  + center crop for validation), :func:`decode_region` (decode no more pixels than the crop needs;
  the caller resizes), :func:`decode` and :func:`decode_into` (crop and resize with Pillow),
  :func:`sample_rng` (an image's crop and flip from ``(seed, epoch, index)``), :func:`resolve_decoder`;
  for decoding on a GPU, :func:`crop_window` (the crop and flip from a
  JPEG's header) and :func:`jpeg_header`;
  normalisation with ImageNet's :data:`MEAN` and :data:`STD`; :data:`RATIO` (the crop's aspect range);
* errors -- :class:`CorruptImageError`, and :data:`PILLOW_MISSING` (what to tell a user without Pillow);
* the loaders themselves -- :class:`ImageFiles` (numpy batches from a thread pool, for consumers
  without a pipeline of their own) and :class:`SyntheticImages` (an in-memory pool).

Imports numpy (and Pillow, when installed): import it where images are decoded, not when a plugin loads.
"""

from ._decode import (
    MEAN,
    PILLOW_MISSING,
    RATIO,
    STD,
    Augment,
    CorruptImageError,
    crop_window,
    decode,
    decode_into,
    decode_region,
    jpeg_header,
    resolve_decoder,
    sample_rng,
)
from ._files import IMAGE_EXTENSIONS, ImageFiles, is_image
from ._order import epoch_order, num_batches
from ._synthetic import SyntheticImages

__all__ = [
    "IMAGE_EXTENSIONS",
    "MEAN",
    "PILLOW_MISSING",
    "RATIO",
    "STD",
    "Augment",
    "CorruptImageError",
    "ImageFiles",
    "SyntheticImages",
    "crop_window",
    "decode",
    "decode_into",
    "decode_region",
    "epoch_order",
    "is_image",
    "jpeg_header",
    "num_batches",
    "resolve_decoder",
    "sample_rng",
]
