"""Bring your own model, data, loss and metrics: a regression, with ``+experiment=regression``.

Everything here is plain user code that ddlkit imports by path (``model.target``, ``data.target``,
``model.loss``, ``model.metrics``); no plugin. The task: predict
``y = sum_i sin(w_i * x_i)`` (+ a little noise) from 8 normal inputs ``x``, with a small MLP.
Predicting the mean scores an MAE of about 1.5 (:func:`mean_baseline_mae`); the MLP gets far below.

The model builder takes the framework from the config (``model.kwargs.framework: ${framework.name}``)
and returns a ``torch.nn.Module`` or a ``keras.Model``. The loss and metric are symmetric in their
two arguments, so they serve PyTorch's ``(outputs, targets)`` and Keras' ``(targets, outputs)`` alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FEATURES = 8
WEIGHTS = np.linspace(0.5, 2.0, FEATURES, dtype=np.float32)


def samples(split: str, n: int = 4096, noise: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``data.target``: ``(inputs, targets)`` arrays, float32 ``(n, 8)`` and ``(n, 1)``; the splits
    are drawn independently."""
    rng = np.random.default_rng({"train": 1, "val": 2}[split])
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    y = np.sin(x * WEIGHTS).sum(axis=1, keepdims=True) + noise * rng.standard_normal((n, 1), dtype=np.float32)
    return x, y.astype(np.float32)


def mean_baseline_mae(n: int = 4096) -> float:
    """The validation MAE of always predicting the training targets' mean."""
    _, train = samples("train", n)
    _, val = samples("val", n)
    return float(np.abs(val - train.mean()).mean())


def mlp(framework: str, hidden: int = 64) -> Any:
    """``model.target``: 8 -> hidden -> hidden -> 1, for ``framework``."""
    if framework == "pytorch":
        from torch import nn

        return nn.Sequential(
            nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
    import keras

    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def _mean(x: Any) -> Any:
    """The batch mean (PyTorch) or one value per example (Keras' convention)."""
    if type(x).__module__.startswith("torch"):
        return x.mean()
    from keras import ops

    return ops.mean(x, axis=-1)


def mse(a: Any, b: Any) -> Any:
    """``model.loss``: mean squared error."""
    return _mean((a - b) ** 2)


def mae(a: Any, b: Any) -> Any:
    """``model.metrics.mae``: mean absolute error (reported as ``val_mae``)."""
    return _mean(abs(a - b))
