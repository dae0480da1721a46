"""ddlkit hooks for Keras (the entry-point target; imports neither Keras nor TensorFlow)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

try:
    from ddlkit_tensorflow import components
except ImportError as err:
    # ddlkit reports a plugin that fails to load with this message when framework=keras is chosen
    raise ImportError(
        "ddlkit-keras needs the ddlkit-tensorflow plugin (models, optimizer, runtime): "
        "pip install -e plugins/ddlkit-tensorflow"
    ) from err


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "keras",
        "ddlkit_keras.framework:KerasFramework",
        config="ddlkit_keras.framework:KerasConfig",
        packages=("keras", "tensorflow", "tensorflow-cpu"),
        description="Keras 3 model.fit (TensorFlow backend), bf16/fp16, XLA",
    )


@ddlkit.hookimpl
def ddlkit_models() -> Iterator[ddlkit.Registration]:
    # the TensorFlow plugin's models and optimizers, registered for framework=keras
    yield from components.models("keras")


@ddlkit.hookimpl
def ddlkit_optimizers() -> Iterator[ddlkit.Registration]:
    yield from components.optimizers("keras")
