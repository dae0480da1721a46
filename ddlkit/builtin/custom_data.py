"""Samples from your own Python code:
`ddlkit data=custom data.target=my_pkg.data:samples +data.kwargs.n=10000 data.num_classes=10`.

`data.target=package.module:function` is called on every rank as
`function(split=split, **data.kwargs)` for `split` `"train"` and `"val"`, and returns the split's
samples, either

- `(inputs, targets)`: two arrays (anything `numpy.asarray` takes) with one row per sample, or
- a sequence of `(input, target)` pairs (anything with `len()` and indexing: a list, a map-style
  dataset).

ddlkit does the rest as for its own data: a fresh shuffle every epoch from `trainer.seed`,
disjoint equal shards per rank, full training batches, and exact mid-epoch resumption.
`data.num_classes` is the number of classes of a classification task (0: another task, with your
`model.loss`), and `data.image_size` says the inputs are `image_size x image_size x 3` HWC images,
which each framework gets in its own layout (NCHW for PyTorch; 0: the inputs reach the model as
they are). float64 arrays become float32.

Before training, every rank checks what the function gave against these settings (arrays whole,
a sequence by its first 8 samples): numeric inputs and targets, inputs of
`image_size x image_size x 3`, and for classification one integer class per sample in
`0 .. num_classes - 1`; a mismatch is one line naming it and the fix, exit status 2. Progress and
the summary count `samples/s` when the inputs are not images.

The function is imported like `model.target`: from the installed packages and from the directory
`ddlkit` is started in, and it travels with a remote job in the job's code snapshot. A whole
example (model, data, loss and metric) is in
[Your own model, data and config directory](../../tutorials/your-own-model.md).

## How it works

This module is also the launcher's side of every import path in the config (`model.target`,
`model.loss`, `model.metrics`, `data.target`, `trainer.callbacks`): each is imported before
anything runs. The order is `ddlkit.images.epoch_order`'s, as for `data=imagefolder`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from ..custom import build, check_importable, import_paths
from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import Batch, DataInfo, DataSource, Shard
from ..interfaces.data import check_split
from ..options import NON_NEGATIVE, checked
from ..registry import Registration

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass
class CustomDataConfig:
    # "package.module:function", called as function(split=..., **kwargs) for split "train" and "val"
    target: str = MISSING
    # keyword arguments for it: +data.kwargs.n=1000
    kwargs: dict[str, Any] = field(default_factory=dict)
    # classes of a classification task (targets are class indices); 0: another task (set model.loss)
    num_classes: int = checked(0, NON_NEGATIVE)
    # the inputs are image_size x image_size x 3 images (HWC), which each framework gets in its own
    # layout (PyTorch: NCHW); 0: the inputs go to the model as they are
    image_size: int = checked(0, NON_NEGATIVE)


class Samples:
    """One split's samples as ddlkit batches them."""

    def __init__(self, produced: Any, where: str) -> None:
        import numpy as np

        self.arrays: tuple[Any, Any] | None = None
        if (
            isinstance(produced, tuple)
            and len(produced) == 2
            and all(hasattr(a, "__len__") and not isinstance(a, tuple) for a in produced)
        ):
            inputs, targets = (_float32(np.asarray(a)) for a in produced)
            if len(inputs) != len(targets):
                raise ConfigError(f"{where} returned {len(inputs)} inputs but {len(targets)} targets.")
            self.arrays = (inputs, targets)
            self.sequence = None
        elif hasattr(produced, "__len__") and hasattr(produced, "__getitem__"):
            self.sequence = produced
        else:
            raise ConfigError(
                f"{where} returned a {type(produced).__name__}: return (inputs, targets) arrays or a "
                "sequence of (input, target) samples."
            )

    def __len__(self) -> int:
        return len(self.arrays[0]) if self.arrays is not None else len(self.sequence)

    def take(self, indices: Any) -> Batch:
        import numpy as np

        if self.arrays is not None:
            return Batch(self.arrays[0][indices], self.arrays[1][indices])
        pairs = [self.sequence[int(i)] for i in indices]
        return Batch(
            _float32(np.stack([np.asarray(x) for x, _ in pairs])), _float32(np.stack([np.asarray(y) for _, y in pairs]))
        )


#: how many samples of a sequence are checked before training (all of them for arrays)
CHECKED_SAMPLES = 8


def check_samples(samples: Samples, cfg: Any, where: str) -> None:
    """What the user's function gave, against ``data.image_size`` and ``data.num_classes``, once,
    before any framework sees it: a wrong dtype, shape or label would otherwise surface as a
    framework's traceback at the first step (issue 23, item 8). Arrays are checked whole, a
    sequence by its first samples."""
    import numpy as np

    if samples.arrays is not None:
        inputs, targets = samples.arrays
    else:
        try:
            inputs, targets = samples.take(np.arange(min(len(samples), CHECKED_SAMPLES)))
        except ValueError as err:  # np.stack of samples whose shapes differ
            raise ConfigError(
                f"{where}: its first samples do not stack into a batch ({err}): every input must have "
                "the same shape, and every target too."
            ) from None
    for what, a in (("inputs", inputs), ("targets", targets)):
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
            raise ConfigError(
                f"{where} gives {what} of dtype {a.dtype}: {what} must be numbers. Convert them in "
                "your function (e.g. np.asarray(x, dtype=np.float32))."
            )
    size = cfg.image_size
    if size and inputs.shape[1:] != (size, size, 3):
        raise ConfigError(
            f"{where} gives inputs of shape {inputs.shape[1:]} per sample, but data.image_size={size} "
            f"means {size}x{size}x3 images (height, width, channels). Give them that shape, set "
            "data.image_size to their size, or data.image_size=0 to give the inputs to the model as "
            "they are."
        )
    classes = cfg.num_classes
    if not classes or not len(targets):
        return
    if targets.ndim != 1:
        raise ConfigError(
            f"{where} gives targets of shape {targets.shape[1:]} per sample, but data.num_classes="
            f"{classes} means one class index per sample (one-hot labels: take their argmax). Or set "
            "data.num_classes=0 and model.loss for another task."
        )
    if not np.issubdtype(targets.dtype, np.integer):
        raise ConfigError(
            f"{where} gives {targets.dtype} targets, but data.num_classes={classes} means class "
            "indices: return integers (e.g. labels.astype(np.int64)), or set data.num_classes=0 and "
            "model.loss for another task."
        )
    low, high = int(targets.min()), int(targets.max())
    if low < 0:
        raise ConfigError(
            f"{where} gives class {low}: class indices run from 0 to data.num_classes - 1 "
            f"({classes - 1}). Fix the labels."
        )
    if high >= classes:
        raise ConfigError(
            f"{where} gives class {high}, but data.num_classes={classes} allows 0 to {classes - 1}. "
            f"Set data.num_classes={high + 1} or fix the labels."
        )


def _float32(a: Any) -> Any:
    import numpy as np

    return a.astype(np.float32) if a.dtype == np.float64 else a


class SampleBatches:
    """Batches of a split's samples in the shared per-epoch order."""

    def __init__(self, samples: Samples, *, batch_size: int, shard: Shard, seed: int, train: bool) -> None:
        from ..images import num_batches

        self.samples, self.batch_size, self.shard, self.seed, self.train = samples, batch_size, shard, seed, train
        self.n = num_batches(len(samples), batch_size, shard, train)

    def __len__(self) -> int:
        return self.n

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        from ..images import epoch_order

        order = epoch_order(
            len(self.samples),
            batch_size=self.batch_size,
            shard=self.shard,
            seed=self.seed,
            epoch=epoch,
            train=self.train,
        )
        b = self.batch_size
        for k in range(start_batch, self.n):
            yield self.samples.take(order[k * b : (k + 1) * b])


class CustomData(DataSource):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self._samples: dict[str, Samples] = {}

    def samples(self, split: str) -> Samples:
        if split not in self._samples:
            produced = build(self.cfg.target, "data.target", {**self.cfg.kwargs, "split": split})
            where = f"data.target={self.cfg.target} (split {split!r})"
            samples = Samples(produced, where)
            check_samples(samples, self.cfg, where)
            self._samples[split] = samples
        return self._samples[split]

    @property
    def info(self) -> DataInfo:
        c = self.cfg
        return DataInfo(c.num_classes, c.image_size, len(self.samples("train")), len(self.samples("val")))

    def loader(self, split: str, *, batch_size: int, shard: Shard, seed: int) -> SampleBatches:
        check_split(split)
        return SampleBatches(self.samples(split), batch_size=batch_size, shard=shard, seed=seed, train=split == "train")


@hookimpl
def ddlkit_data_sources():
    yield Registration(
        "custom",
        CustomData,
        config=CustomDataConfig,
        description="samples from your own function: data.target=package.module:function",
    )


@hookimpl
def ddlkit_configure(config: DictConfig) -> None:
    # a check across the config: user code may be named by the model, the data source and the trainer
    for key, path in import_paths(config):
        check_importable(path, key)
