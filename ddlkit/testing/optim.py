"""Reference computations of the shared optimizers (:mod:`ddlkit.optim`), in numpy, for the tests
of plugins that implement them: ``optimizer=lars`` must mean the same update in every framework,
and so must ``trainer.clip_grad_norm`` and ``trainer.accumulate_batches`` (:func:`linear_step`).

    from ddlkit.testing.optim import lars_reference
    expected = lars_reference(weights, gradients, lrs, LarsConfig(weight_decay=1e-2))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LINEAR_BIAS", "LINEAR_KERNEL", "clip_by_global_norm", "lars_reference", "linear_data", "linear_step"]

#: a tiny linear classifier (4 inputs, 3 classes) and its data, every value exact in float32, for the
#: frameworks' tests of trainer.clip_grad_norm and trainer.accumulate_batches against :func:`linear_step`
LINEAR_KERNEL = np.array([[0.5, -0.25, 0.75], [-1.0, 0.5, 0.25], [0.25, 0.75, -0.5], [1.0, -0.75, 0.5]])
LINEAR_BIAS = np.array([0.125, -0.25, 0.0])


def linear_data(split: str = "train", n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``data.target=ddlkit.testing.optim:linear_data``: ``n`` samples of 4 features (multiples of
    1/4 in [-2, 2]) with labels 0-2."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    return np.round(rng.uniform(-2, 2, (n, 4)) * 4) / 4, rng.integers(0, 3, n)


def clip_by_global_norm(grads: Sequence[np.ndarray], max_norm: float | None) -> list[np.ndarray]:
    """``grads`` scaled together so that their global L2 norm is at most ``max_norm`` (None: as they are)."""
    norm = float(np.sqrt(sum(float(np.sum(np.square(g))) for g in grads)))
    factor = min(1.0, max_norm / norm) if max_norm else 1.0
    return [np.asarray(g, np.float64) * factor for g in grads]


def linear_step(
    kernel: np.ndarray,
    bias: np.ndarray,
    x: np.ndarray,
    labels: np.ndarray,
    lr: float,
    clip_grad_norm: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(kernel, bias)`` of ``logits = x @ kernel + bias`` after one plain SGD step (no momentum,
    no weight decay) on the mean cross-entropy over all of ``x`` -- what any split of ``x`` into
    accumulated micro-batches (``trainer.accumulate_batches``), over any number of ranks, must
    give too -- with the gradient clipped to ``clip_grad_norm`` first."""
    x = np.asarray(x, np.float64)
    logits = x @ kernel + bias
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(x)), labels] -= 1.0  # d(mean cross-entropy)/d(logits) * len(x)
    g_kernel, g_bias = clip_by_global_norm([x.T @ p / len(x), p.mean(axis=0)], clip_grad_norm)
    return kernel - lr * g_kernel, bias - lr * g_bias


def lars_reference(
    weights: Sequence[np.ndarray], gradients: Sequence[Sequence[np.ndarray]], lrs: Sequence[float], cfg: Any
) -> list[np.ndarray]:
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


#: issue 22's trainer options all at once, for a framework's run of the linear model on 64 samples
#: (``data=custom``) whose test directory holds ``linear_model.PrintEpochs`` (a callback printing
#: ``callback: epoch N ...`` at each epoch's end): see :func:`check_every_trainer_option`
EVERY_TRAINER_OPTION = (
    "+data.kwargs.n=64",
    "trainer.epochs=6",
    "trainer.batch_size=4",
    "trainer.accumulate_batches=2",
    "trainer.clip_grad_norm=1.0",
    "trainer.keep_checkpoints=1",
    "trainer.early_stopping.monitor=val_loss",
    "trainer.early_stopping.patience=1",
    "trainer.early_stopping.min_delta=100",
    "trainer.best_checkpoint.monitor=val_top1",
    "trainer.callbacks=[linear_model:PrintEpochs]",
)


def check_every_trainer_option(out: Any) -> dict[str, Any]:
    """What a run with :data:`EVERY_TRAINER_OPTION` must show (``out``: the test kit's
    ``RunOutcome``); returns its ``best_checkpoint`` record for framework-specific checks."""
    from ..checkpoint import BEST, verify

    result = out.result
    # 64 samples / (4 x 2): 8 steps per epoch; no improvement of 100 after epoch 1: stopped after epoch 2
    assert (result["steps_per_epoch"], result["steps"], result["epochs"]) == (8, 16, 2), result
    assert result["stopped_early"]["reason"].startswith("val_loss did not improve by more than 100 for 1 validation")
    assert f"ddlkit: stopping early after epoch 2 (step 16): {result['stopped_early']['reason']}" in out.stdout
    assert [line.split(" val_loss")[0] for line in out.stdout.splitlines() if line.startswith("callback:")] == [
        "callback: epoch 1",
        "callback: epoch 2",
    ]
    assert verify(out.job_dir / "checkpoints" / BEST) is None
    best = result["best_checkpoint"]
    assert best["step"] in (8, 16) and best["monitor"] == "val_top1"
    assert result["clip_grad_norm"] == 1.0
    return best
