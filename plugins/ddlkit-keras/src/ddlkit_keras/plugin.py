"""ddlkit hooks for Keras (the entry-point target; imports neither Keras nor TensorFlow)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from .framework import KerasConfig, KerasFramework  # first: it says what is missing without ddlkit-tensorflow

from ddlkit_tensorflow import components  # noqa: E402,I001


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("keras", KerasFramework, config=KerasConfig,
                              packages=("keras", "tensorflow", "tensorflow-cpu"),
                              description="Keras 3 model.fit (TensorFlow backend), bf16/fp16, XLA")


@ddlkit.hookimpl
def ddlkit_models() -> Iterator[ddlkit.Registration]:
    # the TensorFlow plugin's models and optimizers, registered for framework=keras
    yield from components.models("keras")


@ddlkit.hookimpl
def ddlkit_optimizers() -> Iterator[ddlkit.Registration]:
    yield from components.optimizers("keras")
