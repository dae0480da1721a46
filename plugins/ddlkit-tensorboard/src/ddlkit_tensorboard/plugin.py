"""ddlkit hooks for TensorBoard (the entry-point target; imports no tensorboard)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from .logger import TensorboardConfig, TensorboardLogger


@ddlkit.hookimpl
def ddlkit_loggers() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("tensorboard", TensorboardLogger, config=TensorboardConfig, packages=("tensorboard",),
                              description="TensorBoard event files in the job directory, per step and per epoch")
