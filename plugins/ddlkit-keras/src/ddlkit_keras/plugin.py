"""ddlkit hooks for Keras (the entry-point target; imports neither Keras nor TensorFlow)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from .framework import KerasConfig, KerasFramework


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("keras", KerasFramework, config=KerasConfig,
                              description="Keras 3 model.fit (TensorFlow backend), ResNet-18..152, bf16/fp16, XLA")
