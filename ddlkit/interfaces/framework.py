"""Frameworks: build the model and drive the training loop of one rank."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..run import Run


class Framework(ABC):
    """Trains ``run.cfg.model`` on ``run.data`` and reports through ``run``.

    The framework owns the loop (Keras' ``fit`` must), but everything shared lives in the
    :class:`ddlkit.Run` it is handed: the LR schedule, the throughput meter, logging,
    checkpoint paths and atomic writes, and resume state. A framework therefore calls:

    * ``run.schedule(step)`` for the learning rate of each step;
    * ``run.step_end(step, loss=..., lr=...)`` after every optimizer step (cheap: logs only
      every ``trainer.log_every`` steps, and then needs a host-side loss value);
    * ``run.epoch_end(epoch, val_loss=..., val_top1=..., val_top5=...)`` after validation;
    * ``run.save_checkpoint(write, step=..., epoch=...)`` with a function writing to a path.
    """

    #: model names this framework can build; checked in the launcher
    models: ClassVar[tuple[str, ...]] = ()
    #: the ``framework`` argument this framework passes to :meth:`DataSource.loader`, checked
    #: in the launcher against the data source's ``frameworks``; None: its registered name
    data_format: ClassVar[str | None] = None

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def configure(self, config: DictConfig) -> None:
        """Validate the whole composed config in the launcher; raise ConfigError."""

    @abstractmethod
    def train(self, run: Run) -> None:
        """Train from ``run.resume_from`` (if set) to the end of ``trainer.epochs``."""
