"""What ``framework=pytorch`` registers besides itself: its models and optimizers.

Light at import (the launcher imports it through ``plugin.py``); torch and the optimizer
libraries are imported by the factories, which run on the ranks.

* models: ``resnet18`` ... ``resnet152`` (:mod:`.models`, torchvision's state_dict keys), and
  ``custom``: ``model.target=package.module:function`` called with ``model.kwargs``, which must
  return a ``torch.nn.Module``;
* optimizers: ``sgd`` and ``adamw`` from ``torch.optim``; ``lamb`` and ``lars`` from
  ``pytorch-optimizer`` (torch has neither), each with :mod:`ddlkit.optim`'s schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ddlkit
from ddlkit.custom import CustomModelConfig, build
from ddlkit.optim import AdamWConfig, LambConfig, LarsConfig, SGDConfig

FRAMEWORK = "pytorch"
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


@dataclass
class ResNetConfig:
    # start each residual block as identity (Goyal et al. sec. 5.1); helps large-batch training
    zero_init_residual: bool = False


def _resnet(name: str) -> Callable[..., Any]:
    def build(cfg: Any, data: ddlkit.DataInfo) -> Any:
        from .models import build_model

        return build_model(name, num_classes=data.num_classes, zero_init_residual=cfg.zero_init_residual)

    return build


def build_custom_model(cfg: Any, data: ddlkit.DataInfo) -> Any:
    """``model=custom``: whatever ``model.target`` builds (the framework checks it is a ``torch.nn.Module``)."""
    return build(cfg.target, "model.target", cfg.kwargs)


def models() -> Iterator[ddlkit.Registration]:
    for name in RESNETS:
        yield ddlkit.Registration(
            name,
            _resnet(name),
            config=ResNetConfig,
            framework=FRAMEWORK,
            description=f"{name}, torchvision's layout and state_dict keys",
        )
    yield ddlkit.Registration(
        "custom",
        build_custom_model,
        config=CustomModelConfig,
        framework=FRAMEWORK,
        description="your torch.nn.Module: model.target=package.module:function",
    )


def sgd(cfg: Any, params: Any, **kernel: bool) -> Any:
    """``kernel``: torch's ``fused=True`` or ``foreach=True|False`` (``framework.optimizer_kernel``)."""
    import torch

    return torch.optim.SGD(
        params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov, **kernel
    )


def adamw(cfg: Any, params: Any, **kernel: bool) -> Any:
    """``kernel``: as :func:`sgd`'s."""
    import torch

    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay, **kernel
    )


#: the optimizers whose step torch implements as one fused kernel, as a loop over tensor lists
#: (foreach) or per tensor: the ones framework.optimizer_kernel applies to
KERNEL_OPTIMIZERS = ("sgd", "adamw")


def lamb(cfg: Any, params: Any) -> Any:
    from pytorch_optimizer import Lamb

    # decoupled weight decay (AdamW's), no gradient pre-normalisation: the paper's algorithm 2
    return Lamb(
        params,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        weight_decouple=True,
    )


def lars(cfg: Any, params: Any) -> Any:
    from pytorch_optimizer import LARS

    return LARS(
        params,
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        trust_coefficient=cfg.trust_coefficient,
        nesterov=cfg.nesterov,
    )


def optimizers() -> Iterator[ddlkit.Registration]:
    for name, factory, schema, what in (
        ("sgd", sgd, SGDConfig, "torch.optim.SGD"),
        ("adamw", adamw, AdamWConfig, "torch.optim.AdamW"),
        ("lamb", lamb, LambConfig, "pytorch_optimizer.Lamb"),
        ("lars", lars, LarsConfig, "pytorch_optimizer.LARS"),
    ):
        yield ddlkit.Registration(name, factory, config=schema, framework=FRAMEWORK, description=what)
