"""``data=custom``: samples from the user's own Python code, and the launcher's side of every
import path in the config (``model.target``, ``model.loss``, ``model.metrics``, ``data.target``).

``data.target=package.module:function`` is called on each rank as ``function(split=split, **data.kwargs)``
for ``split`` ``"train"`` and ``"val"``, and returns the split's samples, either

* ``(inputs, targets)``: two arrays (anything ``numpy.asarray`` takes) with one row per sample, or
* a sequence of ``(input, target)`` pairs (``len()`` and indexing: a list, a map-style dataset).

ddlkit does the rest as for its own data: a fresh shuffle per epoch from ``trainer.seed``,
disjoint equal shards per rank, full training batches, and exact mid-epoch resumption
(the order of :mod:`.imagefolder._order`). float64 arrays become float32.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from ..custom import LAUNCH_DIR_ENV, build, check_importable
from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import Batch, DataInfo, DataSource, Shard
from ..interfaces.data import check_split
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
    num_classes: int = 0
    # the inputs are image_size x image_size x 3 images (HWC), which each framework gets in its own
    # layout (PyTorch: NCHW); 0: the inputs go to the model as they are
    image_size: int = 0


class Samples:
    """One split's samples as ddlkit batches them."""

    def __init__(self, produced: Any, where: str) -> None:
        import numpy as np

        self.arrays: tuple[Any, Any] | None = None
        if isinstance(produced, tuple) and len(produced) == 2 and all(hasattr(a, "__len__") and not isinstance(a, tuple)
                                                                      for a in produced):
            inputs, targets = (_float32(np.asarray(a)) for a in produced)
            if len(inputs) != len(targets):
                raise ConfigError(f"{where} returned {len(inputs)} inputs but {len(targets)} targets.")
            self.arrays = (inputs, targets)
            self.sequence = None
        elif hasattr(produced, "__len__") and hasattr(produced, "__getitem__"):
            self.sequence = produced
        else:
            raise ConfigError(f"{where} returned a {type(produced).__name__}: return (inputs, targets) arrays or a "
                              "sequence of (input, target) samples.")

    def __len__(self) -> int:
        return len(self.arrays[0]) if self.arrays is not None else len(self.sequence)

    def take(self, indices: Any) -> Batch:
        import numpy as np

        if self.arrays is not None:
            return Batch(self.arrays[0][indices], self.arrays[1][indices])
        pairs = [self.sequence[int(i)] for i in indices]
        return Batch(_float32(np.stack([np.asarray(x) for x, _ in pairs])), _float32(np.stack([np.asarray(y)
                                                                                                for _, y in pairs])))


def _float32(a: Any) -> Any:
    import numpy as np

    return a.astype(np.float32) if a.dtype == np.float64 else a


class SampleBatches:
    """Batches of a split's samples in the shared per-epoch order."""

    def __init__(self, samples: Samples, *, batch_size: int, shard: Shard, seed: int, train: bool) -> None:
        from .imagefolder._order import num_batches

        self.samples, self.batch_size, self.shard, self.seed, self.train = samples, batch_size, shard, seed, train
        self.n = num_batches(len(samples), batch_size, shard, train)

    def __len__(self) -> int:
        return self.n

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        from .imagefolder._order import epoch_order

        order = epoch_order(len(self.samples), batch_size=self.batch_size, shard=self.shard, seed=self.seed,
                            epoch=epoch, train=self.train)
        b = self.batch_size
        for k in range(start_batch, self.n):
            yield self.samples.take(order[k * b:(k + 1) * b])


class CustomData(DataSource):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self._samples: dict[str, Samples] = {}

    def samples(self, split: str) -> Samples:
        if split not in self._samples:
            produced = build(self.cfg.target, "data.target", {**self.cfg.kwargs, "split": split})
            self._samples[split] = Samples(produced, f"data.target={self.cfg.target} (split {split!r})")
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
    yield Registration("custom", CustomData, config=CustomDataConfig,
                       description="samples from your own function: data.target=package.module:function")


def import_paths(config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(key, import path)`` of every import path the config names."""
    model, data = config.get("model") or {}, config.get("data") or {}
    for key, node in (("model.target", model), ("data.target", data)):
        if node.get("target"):
            yield key, node["target"]
    if model.get("loss"):
        yield "model.loss", model["loss"]
    for name, path in (model.get("metrics") or {}).items():
        yield f"model.metrics.{name}", path


@hookimpl
def ddlkit_configure(config: DictConfig) -> None:
    for key, path in import_paths(config):
        check_importable(path, key)
    data = config.get("data") or {}
    if data.get("name") == "custom":
        for key in ("num_classes", "image_size"):
            if data[key] < 0:
                raise ConfigError(f"data.{key}={data[key]} is invalid: it must be >= 0.")


@hookimpl
def ddlkit_job_environment(config: DictConfig) -> Mapping[str, str] | None:
    # the ranks run in the job directory: they import user code from where ddlkit was started
    if any(import_paths(config)):
        return {LAUNCH_DIR_ENV: os.environ.get(LAUNCH_DIR_ENV) or os.getcwd()}
    return None

