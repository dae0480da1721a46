"""Train on images in ImageNet's layout (or the reference architecture's CSV index), in all three
frameworks:

    ddlkit data=imagefolder data.root=/data/imagenet model=resnet50 trainer.batch_size=64

`data.root` is a directory or `blob://container/prefix`; the selected storage decides how it
becomes readable on each node (`storage=nfs` reads in place, `storage=local_ssd` stages a copy
first: [Datasets, staging and results](../datasets.md)). A relative `data.root` (and a relative
`trainer.resume` checkpoint) is read from the directory `ddlkit` was started in, where the ranks
share its disk (`local`, `local_mpi`, Slurm): the job's `config.yaml` records the absolute path.
On the other targets (Ray, Azure) it is read from the job's copy of that directory, its code
snapshot. With `storage=nfs` a relative `data.root` is below `storage.root` instead, on every target.

| `data.root` holds | |
|---|---|
| `train/<class>/*.JPEG`, `validation/<class>/*.JPEG` (or `val/`) | classes are the sorted folder names; any image extension in any case (`.JPEG`, `.jpg`, `.png`...) |
| `train.csv`, `validation.csv` | the reference's CSV index: `filenames` (relative to `train/`, `validation/`) and 1-based `num_id` |
| `manifest.tsv` | when present, the file list comes from it (fast on a share; how `blob://` roots are listed) |

ImageNet's official validation files come as 50,000 flat files and a label list:
[`ddlkit data prepare`](../datasets.md#prepare-and-upload-a-dataset) puts them into class folders.

## What the ranks read

- **Augmentation**: training images get a random-resized crop (area `data.min_crop_area` to
  100 %, aspect 3/4-4/3) and a horizontal flip; validation images are resized (shorter side
  `data.val_resize`, 256 for 224) and center-cropped (`data.image_size`); all are normalized with
  ImageNet's mean and std.
- **Order**: every epoch is reshuffled from `trainer.seed` and the epoch number, and split into
  disjoint, equal shards per rank. The crops depend on the same, so a run resumed mid-epoch reads
  exactly the batches it had not read, without decoding the others; after a change of world size
  the same holds (the order is fixed by global batch).
- **Pipelines**: the data source itself is framework-neutral (which files, in which order, which
  crops; numpy batches for anything else); each framework plugin builds its own pipeline from it.
  PyTorch gets a `DataLoader` whose worker processes decode whole batches into shared memory;
  TensorFlow and Keras get `tf.data` with parallel decoding that decodes only the crop window of
  a JPEG. JPEGs are decoded with `simplejpeg` (libjpeg-turbo, with DCT scaling) when installed,
  else Pillow, or on the GPU with `data.decoder=gpu` ([GPUs](../gpus.md)).
- **Real-world files**: grayscale and CMYK JPEGs, 16-bit PNGs (their high byte, as TensorFlow
  decodes them) and PNG data behind a `.JPEG` name are converted to RGB. A file that cannot be
  decoded stops the run with an error naming it (`data.on_corrupt=error`; one line and exit
  status 2 in every framework), or, with `data.on_corrupt=skip`, is replaced by the next image of
  the split, with a warning naming it once and a count (batches stay full, epochs keep their
  length).

How fast the pipeline is against a plain `ImageFolder` + PIL `DataLoader`, and how well it keeps
a GPU fed: [Performance](../../explanation/performance.md#last-recorded-results).

## How it works

The listing and labels come from `ddlkit.builtin.imagefolder.index` without decoding anything,
so the data's shape is known before any data is staged (`StorageBackend.prepare_data` makes the
root readable). The loader (`ddlkit.images.ImageFiles`) says which files a rank reads in which
order (`ddlkit.images.epoch_order`) with the augmentation above, and serves numpy batches decoded
by a thread pool; framework plugins build their native pipeline from its `native_spec()` (a
`ddlkit.ImageFilesSpec`) instead, drawing the same crops.
"""  # noqa: E501 -- a Markdown table: its rows cannot be wrapped

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import MISSING

from ...errors import ConfigError
from ...hookspecs import hookimpl
from ...interfaces import DataInfo, DataSource, Shard
from ...interfaces.data import check_split
from ...registry import Registration
from ...storage import is_url

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ...images import ImageFiles
    from ...interfaces import RunContext
    from .index import DatasetIndex


class Layout(StrEnum):
    auto = "auto"
    folders = "folders"
    csv = "csv"


class OnCorrupt(StrEnum):
    error = "error"
    skip = "skip"


class Decoder(StrEnum):
    auto = "auto"
    simplejpeg = "simplejpeg"
    pil = "pil"
    gpu = "gpu"


@dataclass
class ImageFolderConfig:
    # the dataset: a directory (train/<class>/*.JPEG, validation/<class>/*.JPEG, or train.csv +
    # validation.csv) or blob://container/prefix (staged by storage=local_ssd)
    root: str = MISSING
    # auto: the CSV index when train.csv exists, else class folders
    layout: Layout = Layout.auto
    # square side of the images the model sees
    image_size: int = 224
    # validation: shorter side resized to this before the center crop; null: image_size / 0.875 (256 for 224)
    val_resize: int | None = None
    # random-resized crop: the smallest crop, as a fraction of the image's area
    min_crop_area: float = 0.08
    # decoding processes (pytorch) or threads (tensorflow, keras) per rank; -1: the node's cores
    # divided among its ranks (tf.data autotunes)
    workers: int = -1
    # a file that cannot be decoded: error (stop, naming it) or skip (warn, count, use the next image)
    on_corrupt: OnCorrupt = OnCorrupt.error
    # JPEG decoder: auto (simplejpeg when installed, else Pillow), simplejpeg, pil, or gpu (nvJPEG on
    # the rank's GPU through torchvision, framework=pytorch, for ranks with few CPU cores of their own:
    # the files it does not take -- grayscale, CMYK, not JPEG, truncated -- are decoded as with auto)
    decoder: Decoder = Decoder.auto


class ImageFolderData(DataSource):
    def __init__(self, cfg: DictConfig | ImageFolderConfig) -> None:
        super().__init__(cfg)
        self._index: DatasetIndex | None = None
        self._local_root: Path | None = None
        self._run: RunContext | None = None

    @property
    def index(self) -> DatasetIndex:
        if self._index is None:
            from .index import load_index  # here: composing a config reads no dataset

            self._index = load_index(self.cfg.root, self.cfg.layout)
        return self._index

    @property
    def info(self) -> DataInfo:
        index = self.index
        return DataInfo(len(index.classes), self.cfg.image_size, len(index.train), len(index.val))

    def prepare(self, run: RunContext) -> None:
        self._run = run
        self._local_root = run.storage.prepare_data(self.cfg.root, run)

    @property
    def local_root(self) -> Path:
        """Where the images are read from on this node."""
        if self._local_root is not None:
            return self._local_root
        if is_url(self.cfg.root):
            raise ConfigError(
                f"data.root={self.cfg.root} must be staged before it is read: use storage=local_ssd "
                "(or another staging storage)."
            )
        return Path(self.cfg.root).expanduser()

    def loader(self, split: str, *, batch_size: int, shard: Shard, seed: int) -> ImageFiles:
        # numpy and Pillow: imported where images are decoded, not when the plugin loads
        from ...images import Augment, ImageFiles, resolve_decoder

        check_split(split)
        part = self.index.split(split)
        if not len(part):
            raise ConfigError(
                f"data.root={self.cfg.root} has no {'training' if split == 'train' else 'validation'} "
                "images"
                + ("; add validation/<class>/ folders or set trainer.validate=false." if split == "val" else ".")
            )
        c = self.cfg
        if c.image_size < 1 or not 0 < c.min_crop_area <= 1:
            raise ConfigError("data.image_size must be >= 1 and data.min_crop_area in (0, 1].")
        aug = Augment(
            size=c.image_size,
            train=split == "train",
            val_resize=c.val_resize or round(c.image_size / 0.875),
            min_area=c.min_crop_area,
            decoder=resolve_decoder(c.decoder),
            device_decoding=c.decoder == Decoder.gpu,
        )
        root = self.local_root
        return ImageFiles(
            [str(root / p) for p in part.paths],
            part.labels,
            aug,
            batch_size=batch_size,
            shard=shard,
            seed=seed,
            workers=c.workers,
            on_corrupt=c.on_corrupt,
            local_size=self._run.dist.local_size if self._run is not None else 1,
        )


@hookimpl
def ddlkit_data_sources():
    yield Registration(
        "imagefolder",
        ImageFolderData,
        config=ImageFolderConfig,
        description="images in ImageNet's class-folder layout or the reference's CSV index",
    )
