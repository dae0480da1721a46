"""What ``framework=pytorch`` registers besides itself: its models and optimizers.

Light at import (the launcher imports it through ``plugin.py``); torch and the optimizer
libraries are imported by the factories, which run on the ranks.

* models: ``resnet18`` ... ``resnet152`` (:mod:`.models`), ``vit_b_16``, ``vit_l_16``,
  ``vit_h_14`` (:mod:`.vit`, built for the data's image size) and ``swin_t``, ``swin_b``
  (:mod:`.swin`), with torchvision's state_dict keys; and
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
from ddlkit.options import IN_0_1, checked

FRAMEWORK = "pytorch"
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
#: the Vision Transformers and the Swin Transformers
VITS = ("vit_b_16", "vit_l_16", "vit_h_14")
SWINS = ("swin_t", "swin_b")
#: each transformer's patch side: a ViT's image side must be a multiple, a Swin's at least one patch
PATCH_SIZES = {"vit_b_16": 16, "vit_l_16": 16, "vit_h_14": 14, "swin_t": 4, "swin_b": 4}


@dataclass
class ResNetConfig:
    # start each residual block as identity (Goyal et al. sec. 5.1); helps large-batch training
    zero_init_residual: bool = False


def _resnet(name: str) -> Callable[..., Any]:
    def build(cfg: Any, data: ddlkit.DataInfo) -> Any:
        from .models import build_model

        return build_model(name, num_classes=data.num_classes, zero_init_residual=cfg.zero_init_residual)

    return build


@dataclass
class ViTConfig:
    # dropout after the attention, in the MLP and on the embeddings (torchvision's `dropout`)
    dropout: float = checked(0.0, IN_0_1)
    # dropout of the attention weights (torchvision's `attention_dropout`)
    attention_dropout: float = checked(0.0, IN_0_1)


@dataclass
class SwinTConfig(ViTConfig):
    # the rate at which the last block's residual branches are dropped (stochastic depth); it
    # grows linearly from 0 at the first block. torchvision's default for this model
    stochastic_depth_prob: float = checked(0.2, IN_0_1)


@dataclass
class SwinBConfig(SwinTConfig):
    stochastic_depth_prob: float = checked(0.5, IN_0_1)


def check_image_size(name: str, image_size: int) -> None:
    """``data.image_size`` suits the transformer ``name`` (a ViT: a multiple of its patch side; a
    Swin: at least one patch), or a ConfigError saying which sizes would do."""
    patch = PATCH_SIZES[name]
    if image_size <= 0:
        raise ddlkit.ConfigError(
            f"model={name} takes images, and this data has none (data.image_size={image_size}): "
            "use an image data source, or another model."
        )
    if name in VITS and image_size % patch:
        lower, upper = image_size // patch * patch, (image_size // patch + 1) * patch
        sizes = f"{lower} or {upper}" if lower else f"{upper}"
        raise ddlkit.ConfigError(
            f"data.image_size={image_size} is not a multiple of model={name}'s patch size {patch}: "
            f"set data.image_size={sizes}, for example."
        )
    if image_size < patch:
        raise ddlkit.ConfigError(
            f"data.image_size={image_size} is smaller than model={name}'s patch size {patch}: "
            f"set data.image_size={patch} or more."
        )


def _transformer(name: str) -> Callable[..., Any]:
    def build(cfg: Any, data: ddlkit.DataInfo) -> Any:
        check_image_size(name, data.image_size)
        if name in VITS:
            from . import vit

            # the position embedding has one entry per patch: the model is built for the data's image size
            return vit.MODELS[name](
                image_size=data.image_size,
                num_classes=data.num_classes,
                dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout,
            )
        from . import swin

        return swin.MODELS[name](
            num_classes=data.num_classes,
            dropout=cfg.dropout,
            attention_dropout=cfg.attention_dropout,
            stochastic_depth_prob=cfg.stochastic_depth_prob,
        )

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
    for name, schema in (
        ("vit_b_16", ViTConfig),
        ("vit_l_16", ViTConfig),
        ("vit_h_14", ViTConfig),
        ("swin_t", SwinTConfig),
        ("swin_b", SwinBConfig),
    ):
        yield ddlkit.Registration(
            name,
            _transformer(name),
            config=schema,
            framework=FRAMEWORK,
            description=f"{name}, {PATCH_SIZES[name]} px patches; torchvision's layout and state_dict keys",
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
