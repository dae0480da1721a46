"""What ``framework=tensorflow`` (and, through :func:`models` and :func:`optimizers`, ``framework=keras``)
registers besides itself: models and optimizers.

Light at import (the launcher imports it through ``plugin.py``); TensorFlow and Keras are imported
by the factories, which run on the ranks.

* models: ``resnet18`` ... ``resnet152`` (:mod:`.models`, the PyTorch plugin's networks) and
  ``custom``: ``model.target=package.module:function`` called with ``model.kwargs``, which must
  return a ``keras.Model``;
* optimizers, each with :mod:`ddlkit.optim`'s schema: ``sgd`` (:class:`.training.TorchSGD`, PyTorch's
  update), ``adamw`` and ``lamb`` (Keras' own), ``lars`` (:class:`.training.Lars`: Keras has none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ddlkit
from ddlkit.custom import CustomModelConfig, build
from ddlkit.optim import AdamWConfig, LambConfig, LarsConfig, SGDConfig

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


@dataclass
class ResNetConfig:
    # start each residual block as identity (Goyal et al. sec. 5.1); helps large-batch training
    zero_init_residual: bool = False


def _resnet(name: str) -> Callable[..., Any]:
    def build(cfg: Any, data: ddlkit.DataInfo) -> Any:
        from .models import build_model

        return build_model(name, data.num_classes, data.image_size or None, zero_init_residual=cfg.zero_init_residual)

    return build


def build_custom_model(cfg: Any, data: ddlkit.DataInfo) -> Any:
    """``model=custom``: whatever ``model.target`` builds (the framework checks it is a ``keras.Model``)."""
    return build(cfg.target, "model.target", cfg.kwargs)


def models(framework: str) -> Iterator[ddlkit.Registration]:
    for name in RESNETS:
        yield ddlkit.Registration(
            name,
            _resnet(name),
            config=ResNetConfig,
            framework=framework,
            description=f"{name} in Keras 3, the PyTorch plugin's network",
        )
    yield ddlkit.Registration(
        "custom",
        build_custom_model,
        config=CustomModelConfig,
        framework=framework,
        description="your keras.Model: model.target=package.module:function",
    )


def sgd(cfg: Any) -> Any:
    from .training import TorchSGD

    return TorchSGD(learning_rate=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, l2=cfg.weight_decay)


def adamw(cfg: Any) -> Any:
    import keras

    return keras.optimizers.AdamW(
        learning_rate=cfg.lr, weight_decay=cfg.weight_decay, beta_1=cfg.beta1, beta_2=cfg.beta2, epsilon=cfg.eps
    )


def lamb(cfg: Any) -> Any:
    import keras

    return keras.optimizers.Lamb(
        learning_rate=cfg.lr, beta_1=cfg.beta1, beta_2=cfg.beta2, epsilon=cfg.eps, weight_decay=cfg.weight_decay
    )


def lars(cfg: Any) -> Any:
    from .training import Lars

    return Lars(
        learning_rate=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        l2=cfg.weight_decay,
        trust_coefficient=cfg.trust_coefficient,
    )


def optimizers(framework: str) -> Iterator[ddlkit.Registration]:
    for name, factory, schema, what in (
        ("sgd", sgd, SGDConfig, "SGD with torch.optim.SGD's update"),
        ("adamw", adamw, AdamWConfig, "keras.optimizers.AdamW"),
        ("lamb", lamb, LambConfig, "keras.optimizers.Lamb"),
        ("lars", lars, LarsConfig, "LARS (ddlkit_tensorflow.training.Lars)"),
    ):
        yield ddlkit.Registration(name, factory, config=schema, framework=framework, description=what)
