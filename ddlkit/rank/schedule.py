"""The learning-rate rule shared by every framework (Goyal et al., arXiv:1706.02677).

``lr(step) = base_lr * scale(global_batch / reference_batch) * warmup(step) * decay(step)``:

* scaling with the batch: the base rate is stated for ``reference_batch`` (256) and scaled with
  the global batch (per-rank batch x world size) by ``scale_lr`` (:class:`LRScaling`): linearly
  for SGD and LARS (Goyal et al.), by the square root for AdamW and LAMB (each optimizer's schema
  in :mod:`ddlkit.optim` chooses);
* gradual warm-up: rising linearly from ``peak / warmup_steps`` to the peak over
  ``warmup_epochs`` (large-batch training diverges without it);
* step decay: multiplied by ``decay_factor`` at each epoch in ``decay_epochs``.

Pure Python so TensorFlow, Keras and PyTorch all call the same function (one copy, not three).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from ..optim import LRScaling


@dataclass(frozen=True)
class LRSchedule:
    base_lr: float
    global_batch: int
    steps_per_epoch: int
    warmup_epochs: float = 5.0
    decay_epochs: Sequence[float] = (30, 60, 80)
    decay_factor: float = 0.1
    reference_batch: int = 256
    #: an :class:`LRScaling` or its name
    scale_lr: LRScaling | str = LRScaling.linear
    #: optimizer steps taken at another global batch than this one's, beyond where this one's steps
    #: would be (a run resumed on another world size, ``trainer.on_resize=scale_lr``): the schedule
    #: counts from ``step - step_offset``, so that warm-up and decay stay at their epochs
    step_offset: int = 0

    @property
    def scaling(self) -> LRScaling:
        return LRScaling(self.scale_lr)

    @property
    def peak_lr(self) -> float:
        return self.scaling.peak_lr(self.base_lr, self.global_batch, self.reference_batch)

    def __call__(self, step: int) -> float:
        """Learning rate for the 0-based optimizer step ``step``."""
        step -= self.step_offset
        warmup_steps = round(self.warmup_epochs * self.steps_per_epoch)
        if step < warmup_steps:
            return self.peak_lr * (step + 1) / warmup_steps
        boundaries = sorted(round(e * self.steps_per_epoch) for e in self.decay_epochs)
        return self.peak_lr * self.decay_factor ** bisect.bisect_right(boundaries, step)
