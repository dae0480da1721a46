"""Watching a validation metric: early stopping (``trainer.early_stopping``) and the best
checkpoint (``trainer.best_checkpoint``), judged by :class:`ddlkit.Run` for every framework.

Both watch the mean over ranks of a metric the run's validation reports, so every rank judges
the same numbers; the run still has the ranks agree before they stop (see ``Run.epoch_end``).
The launcher checks the settings first (:func:`check`): a monitor that names no metric of the
run is one line, exit 2, naming the ones there are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: which way each of ddlkit's own validation metrics is better (``mode=auto``)
DIRECTIONS = {"val_loss": "min", "val_top1": "max", "val_top5": "max"}
MODES = ("auto", "min", "max")
#: the settings under ``trainer`` that watch a metric
WATCHERS = ("early_stopping", "best_checkpoint")


def validation_metrics(cfg: DictConfig) -> list[str]:
    """The metrics the run's validation reports: ``val_loss`` and, for a model with its own loss,
    ``val_<name>`` of ``model.metrics``; else top-1 and (over 5 classes, or classes not stated
    in the config) top-5."""
    model = cfg.model
    if model.get("loss"):
        return ["val_loss", *(f"val_{name}" for name in model.get("metrics") or {})]
    classes = cfg.data.get("num_classes")
    return ["val_loss", "val_top1", *(["val_top5"] if not isinstance(classes, int) or classes > 5 else [])]


def direction(key: str, monitor: str, mode: str) -> str:
    """``min`` or ``max`` for ``monitor`` under ``mode`` (``key``: the setting, for messages)."""
    if mode not in MODES:
        raise ConfigError(f"trainer.{key}.mode={mode} is invalid: choose one of {', '.join(MODES)}.")
    if mode != "auto":
        return mode
    if monitor not in DIRECTIONS:
        raise ConfigError(
            f"trainer.{key}.mode=auto cannot tell whether {monitor} is better up or down: set "
            f"trainer.{key}.mode=min or trainer.{key}.mode=max."
        )
    return DIRECTIONS[monitor]


def check(cfg: DictConfig) -> None:
    """Launcher-side: the watchers' settings are valid for this run."""
    t = cfg.trainer
    for key in WATCHERS:
        node = t[key]
        if node.monitor is None:
            continue
        if not t.validate:
            raise ConfigError(
                f"trainer.{key}.monitor={node.monitor} watches validation, but trainer.validate=false: "
                f"set trainer.validate=true, or trainer.{key}.monitor=null."
            )
        require_metric(key, node.monitor, validation_metrics(cfg))
        direction(key, node.monitor, node.mode)


def require_metric(key: str, monitor: str, available: list[str]) -> None:
    if monitor not in available:
        raise ConfigError(
            f"trainer.{key}.monitor={monitor} is not a validation metric of this run: choose one of "
            f"{', '.join(available)}."
        )


class Watch:
    """The best value so far of one metric, and when it was reached."""

    def __init__(self, key: str, cfg: Any) -> None:
        self.key = key
        self.monitor: str = cfg.monitor
        self.mode = direction(key, cfg.monitor, cfg.mode)
        self.min_delta = float(cfg.get("min_delta", 0.0))
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_epoch: int | None = None

    def value(self, metrics: dict[str, float]) -> float:
        if self.monitor not in metrics:
            # a metric the launcher could not rule out (val_top5 of a data set with 5 classes or fewer)
            require_metric(self.key, self.monitor, sorted(metrics))
        return metrics[self.monitor]

    def update(self, metrics: dict[str, float], *, step: int, epoch: int) -> bool:
        """Take this validation's metrics; True if the monitored one improved on the best by more than
        ``min_delta`` (the first value always does)."""
        value = self.value(metrics)
        if self.best is not None:
            gain = self.best - value if self.mode == "min" else value - self.best
            if not gain > self.min_delta:
                return False
        self.best, self.best_step, self.best_epoch = value, step, epoch
        return True

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "best_epoch": self.best_epoch}

    def load(self, state: dict[str, Any]) -> None:
        self.best, self.best_step, self.best_epoch = state["best"], state["best_step"], state["best_epoch"]


class EarlyStopping(Watch):
    """Stops after ``patience`` validations in a row without an improvement (as Lightning's
    ``EarlyStopping`` counts them)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__("early_stopping", cfg)
        self.patience = int(cfg.patience)
        self.wait = 0
        #: why the run stopped early (None while it goes on)
        self.reason: str | None = None

    def should_stop(self, metrics: dict[str, float], *, step: int, epoch: int) -> bool:
        if self.update(metrics, step=step, epoch=epoch):
            self.wait = 0
            return False
        self.wait += 1
        if self.wait >= self.patience:
            delta = f" by more than {self.min_delta:g}" if self.min_delta else ""
            self.reason = (
                f"{self.monitor} did not improve{delta} for {self.wait} validation(s) (patience "
                f"{self.patience}; best {self.best:.6g} at epoch {self.best_epoch}, step {self.best_step})"
            )
        return self.reason is not None

    def state(self) -> dict[str, Any]:
        return {**super().state(), "wait": self.wait, "reason": self.reason}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.wait, self.reason = state["wait"], state["reason"]
