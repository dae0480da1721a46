"""ddlkit hooks for TensorFlow (the entry-point target; imports neither TensorFlow nor Keras)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from .framework import TensorflowConfig, TensorflowFramework


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("tensorflow", TensorflowFramework, config=TensorflowConfig,
                              description="TensorFlow: tf.function + GradientTape loop, ResNet-18..152, bf16/fp16, XLA")
