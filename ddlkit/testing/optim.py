"""Reference computations of the shared optimizers (:mod:`ddlkit.optim`), in numpy, for the tests
of plugins that implement them: ``optimizer=lars`` must mean the same update in every framework.

    from ddlkit.testing.optim import lars_reference
    expected = lars_reference(weights, gradients, lrs, LarsConfig(weight_decay=1e-2))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["lars_reference"]


def lars_reference(weights: Sequence[np.ndarray], gradients: Sequence[Sequence[np.ndarray]], lrs: Sequence[float],
                   cfg: Any) -> list[np.ndarray]:
    """``weights`` after one LARS step per entry of ``gradients`` (each a list, one gradient per
    weight) at the learning rates ``lrs``, with ``cfg``'s momentum, weight_decay,
    trust_coefficient and nesterov (:class:`ddlkit.optim.LarsConfig`). Weights of more than one
    dimension get the layer-wise trust ratio and the weight decay; the others plain momentum SGD."""
    w = [np.asarray(x, np.float64).copy() for x in weights]
    buffers = [np.zeros_like(x) for x in w]
    for grads, lr in zip(gradients, lrs, strict=True):
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            if w[i].ndim > 1:
                w_norm, g_norm = np.linalg.norm(w[i]), np.linalg.norm(g)
                denominator = g_norm + cfg.weight_decay * w_norm
                trust = cfg.trust_coefficient * w_norm / denominator if w_norm > 0 and denominator > 0 else 1.0
                g = (g + cfg.weight_decay * w[i]) * trust
            if cfg.momentum:
                buffers[i] = cfg.momentum * buffers[i] + g
                g = g + cfg.momentum * buffers[i] if cfg.nesterov else buffers[i]
            w[i] = w[i] - lr * g
    return w
