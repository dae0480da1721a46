"""The optimizer options every framework shares.

Framework plugins register their optimizers (``ddlkit_optimizers``); the core keeps no list of
them. What the core does own is the learning-rate rule every optimizer follows -- scaled with
the global batch and warmed up (Goyal et al., :mod:`ddlkit.rank.schedule`), applied by the
:class:`ddlkit.Run` -- and the schemas of the standard optimizers, so that
``optimizer=adamw optimizer.beta2=0.98`` means the same whichever framework runs it. A plugin
that registers one of these names uses its schema here; a plugin's own optimizer subclasses
:class:`OptimizerConfig`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .options import IN_0_1, NON_NEGATIVE, POSITIVE, checked

__all__ = ["AdamWConfig", "LRScaling", "LambConfig", "LarsConfig", "OptimizerConfig", "SGDConfig"]


class LRScaling(enum.StrEnum):
    """How the peak learning rate follows the global batch (``optimizer.scale_lr``)."""

    #: lr x batch / reference: SGD's rule (Goyal et al., arXiv:1706.02677), which LARS keeps
    linear = "linear"
    #: lr x sqrt(batch / reference): the rule for adaptive optimizers -- derived for Adam and
    #: RMSprop by Malladi et al., "On the SDEs and Scaling Rules for Adaptive Gradient
    #: Algorithms" (NeurIPS 2022, arXiv:2205.10287); what LAMB's authors scale by (arXiv:1904.00962)
    sqrt = "sqrt"
    #: the rate as given, whatever the batch
    none = "none"

    def peak_lr(self, base_lr: float, global_batch: int, reference_batch: int) -> float:
        """The rate for ``global_batch`` when ``base_lr`` is the rate for ``reference_batch``."""
        ratio = global_batch / reference_batch
        return base_lr * {LRScaling.linear: ratio, LRScaling.sqrt: math.sqrt(ratio), LRScaling.none: 1.0}[self]


@dataclass
class OptimizerConfig:
    """The schedule (and loss smoothing) options of every optimizer."""

    # learning rate for a global batch of `reference_batch`, scaled to the real global batch by `scale_lr`
    lr: float = checked(0.1, POSITIVE)
    # linear: lr x global_batch / reference_batch (Goyal et al.: SGD, LARS); sqrt: x its square root
    # (adaptive optimizers: AdamW, LAMB); none: lr as given
    scale_lr: LRScaling = LRScaling.linear
    # the global batch lr is given for
    reference_batch: int = 256
    # linear warm-up length in epochs (may be fractional)
    warmup_epochs: float = checked(5.0, NON_NEGATIVE)
    # epochs at which lr is multiplied by decay_factor
    decay_epochs: list[float] = field(default_factory=lambda: [30.0, 60.0, 80.0])
    # what lr is multiplied by at each of decay_epochs
    decay_factor: float = 0.1
    # cross-entropy label smoothing (classification)
    label_smoothing: float = checked(0.0, IN_0_1)


@dataclass
class SGDConfig(OptimizerConfig):
    """SGD with momentum and coupled L2 weight decay, as ``torch.optim.SGD``."""

    # the momentum (heavy ball) coefficient
    momentum: float = checked(0.9, IN_0_1)
    # coupled L2: weight_decay x the weights is added to the gradient
    weight_decay: float = checked(1e-4, NON_NEGATIVE)
    # Nesterov momentum
    nesterov: bool = False


@dataclass
class AdamWConfig(OptimizerConfig):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as ``torch.optim.AdamW``."""

    lr: float = checked(0.001, POSITIVE)
    # Adam's steps follow the square root of the batch (Malladi et al., NeurIPS 2022, arXiv:2205.10287)
    scale_lr: LRScaling = LRScaling.sqrt
    # the decay rate of the gradients' moving average
    beta1: float = checked(0.9, IN_0_1)
    # the decay rate of the squared gradients' moving average
    beta2: float = checked(0.999, IN_0_1)
    # added to the denominator, for numerical stability
    eps: float = checked(1e-8, POSITIVE)
    # decoupled: each step multiplies the weights by (1 - lr * weight_decay)
    weight_decay: float = checked(0.01, NON_NEGATIVE)


@dataclass
class LambConfig(AdamWConfig):
    """LAMB (You et al., arXiv:1904.00962): AdamW's update scaled per tensor by ||w|| / ||update||;
    its learning rate follows the square root of the batch, as in the paper (inherited from AdamW)."""

    lr: float = checked(0.004, POSITIVE)
    eps: float = checked(1e-6, POSITIVE)


@dataclass
class LarsConfig(OptimizerConfig):
    """LARS (You et al., arXiv:1708.03888): SGD with momentum whose step for each weight matrix or
    kernel is scaled by trust_coefficient * ||w|| / (||g|| + weight_decay * ||w||); biases and
    BatchNorm parameters take plain SGD steps without weight decay."""

    # the momentum coefficient
    momentum: float = checked(0.9, IN_0_1)
    # L2 weight decay of the weight matrices and kernels (not of biases and BatchNorm parameters)
    weight_decay: float = checked(1e-4, NON_NEGATIVE)
    # eta in the paper
    trust_coefficient: float = checked(0.001, POSITIVE)
    # Nesterov momentum
    nesterov: bool = False
