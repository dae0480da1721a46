"""ddlkit hooks for TensorBoard (the entry-point target; imports no tensorboard)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec
from typing import TYPE_CHECKING

import ddlkit

from .logger import TensorboardConfig, TensorboardLogger

if TYPE_CHECKING:
    from omegaconf import DictConfig


@ddlkit.hookimpl
def ddlkit_loggers() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("tensorboard", TensorboardLogger, config=TensorboardConfig,
                              description="TensorBoard event files in the job directory, per step and per epoch")


@ddlkit.hookimpl
def ddlkit_configure(config: DictConfig) -> None:
    cfg = (config.get("logger") or {}).get("tensorboard")
    if cfg is None:
        return
    if find_spec("tensorboard") is None:
        raise ddlkit.ConfigError("logger=tensorboard needs the tensorboard package: pip install tensorboard "
                                 "(or drop tensorboard from logger).")
    if not cfg.subdir or cfg.subdir.startswith(("/", "..")):
        raise ddlkit.ConfigError(f"logger.tensorboard.subdir={cfg.subdir} is invalid: it must be a relative path "
                                 "inside the job directory, e.g. tensorboard.")
