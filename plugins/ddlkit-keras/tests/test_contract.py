"""framework=keras against the test kit's FrameworkContract: what every framework plugin owes the
core, here through model.fit and ddlkit's callback (results through the Run, hooks at each logging
step and epoch, max_steps, and a resumed run that ends with the weights of an uninterrupted one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddlkit.testing.contracts import FrameworkContract

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.slow


def saved_weights(path: Path) -> list[np.ndarray]:
    import keras

    return [np.asarray(w) for w in keras.models.load_model(path, compile=False).weights]


class TestKerasFramework(FrameworkContract):
    framework = "keras"
    plugin = "ddlkit_keras.plugin"
    model_file = "model.keras"
    overrides = (*FrameworkContract.overrides, "model=resnet18", "framework.num_threads=1")

    def assert_same_weights(self, a: Path, b: Path) -> None:
        # a .keras file records when it was saved: equal weights, different bytes
        for x, y in zip(saved_weights(a), saved_weights(b), strict=True):
            np.testing.assert_array_equal(x, y)
