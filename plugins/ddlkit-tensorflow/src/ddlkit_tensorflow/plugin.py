"""ddlkit hooks for TensorFlow (the entry-point target; imports neither TensorFlow nor Keras)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from . import components


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "tensorflow",
        "ddlkit_tensorflow.framework:TensorflowFramework",
        config="ddlkit_tensorflow.framework:TensorflowConfig",
        packages=("tensorflow", "tensorflow-cpu", "keras", "horovod"),
        description="TensorFlow: tf.function + GradientTape loop, bf16/fp16, XLA",
    )


@ddlkit.hookimpl
def ddlkit_models() -> Iterator[ddlkit.Registration]:
    yield from components.models("tensorflow")


@ddlkit.hookimpl
def ddlkit_optimizers() -> Iterator[ddlkit.Registration]:
    yield from components.optimizers("tensorflow")
