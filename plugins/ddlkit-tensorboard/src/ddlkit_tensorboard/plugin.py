"""ddlkit hooks for TensorBoard (the entry-point target; imports no tensorboard)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit


@ddlkit.hookimpl
def ddlkit_loggers() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "tensorboard",
        "ddlkit_tensorboard.logger:TensorboardLogger",
        config="ddlkit_tensorboard.logger:TensorboardConfig",
        packages=("tensorboard",),
        description="TensorBoard event files in the job directory, per step and per epoch",
    )
