"""ResNet-18/34/50/101/152 in Keras 3, shared by ``framework=tensorflow`` and ``framework=keras``.

One definition for all five depths, written to be the *same network* as the PyTorch plugin's
(``ddlkit_pytorch.models``, itself torchvision's layout), so that images/sec and accuracy
compare across frameworks:

* ResNet v1.5: the bottleneck's stride sits on the 3x3 conv, as in torchvision and NVIDIA's
  reference. (``keras.applications.ResNet50`` is v1 - stride on the 1x1 conv - and gives its
  convolutions biases, so it has 26,560 more trainable parameters and different numerics; it also has
  no 18/34-layer variants. Hence a definition here rather than keras.applications.)
* no convolution bias (BatchNorm follows every conv), BatchNorm eps 1e-5 and momentum 0.9
  (PyTorch's momentum=0.1 counted the other way), the same initialisers as torchvision;
* PyTorch's symmetric padding: every strided conv and the stem's max-pool get explicit
  ``ZeroPadding2D`` then ``valid`` (Keras' ``same`` pads stride-2 convs asymmetrically);
  zero padding before the max-pool equals PyTorch's -inf padding because it follows a ReLU.

Layers that hold weights are named after torchvision's modules (``layer2.0.downsample.0``),
so a state_dict maps onto the Keras model name by name (conv kernels transposed OIHW -> HWIO).
Trainable parameter counts equal torchvision's (11,689,512 for ResNet-18 at 1000 classes).

Images are NHWC (channels last), TensorFlow's native CPU layout. The classifier runs in
float32 under mixed precision (Keras' advice for numerically stable logits).

Imported only inside a framework's ``train()``: it imports Keras at module level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
from keras import layers

__all__ = ["MODELS", "build_model"]

#: name -> (block kind, blocks per stage), as in torchvision.models.resnet
MODELS: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}


def _conv_init() -> keras.initializers.Initializer:
    """torchvision's kaiming_normal_(mode="fan_out", nonlinearity="relu"); Keras counts the fan_out
    of an HWIO kernel as kh * kw * out, as PyTorch does for OIHW.

    A new instance per layer: an unseeded Keras initializer fixes its seed when constructed
    (from Python's ``random``, which ``keras.utils.set_random_seed`` seeds), so one shared
    instance would give every same-shaped kernel the same values.
    """
    return keras.initializers.VarianceScaling(scale=2.0, mode="fan_out", distribution="untruncated_normal")


def _conv(x: Any, filters: int, kernel: int, stride: int, name: str) -> Any:
    pad = kernel // 2
    if stride > 1 and pad:
        x = layers.ZeroPadding2D(pad, name=f"{name}.pad")(x)
        padding = "valid"
    else:
        # stride 1 with an odd kernel: Keras' "same" pads symmetrically, exactly like PyTorch
        padding = "same"
    return layers.Conv2D(
        filters, kernel, strides=stride, padding=padding, use_bias=False, kernel_initializer=_conv_init(), name=name
    )(x)


def _bn(x: Any, name: str, zero_gamma: bool = False) -> Any:
    return layers.BatchNormalization(
        momentum=0.9, epsilon=1e-5, gamma_initializer="zeros" if zero_gamma else "ones", name=name
    )(x)


def _basic_block(x: Any, planes: int, stride: int, project: bool, name: str, zero_init_residual: bool) -> Any:
    out = layers.ReLU(name=f"{name}.relu1")(_bn(_conv(x, planes, 3, stride, f"{name}.conv1"), f"{name}.bn1"))
    out = _bn(_conv(out, planes, 3, 1, f"{name}.conv2"), f"{name}.bn2", zero_init_residual)
    return _merge(x, out, planes, stride, project, name)


def _bottleneck(x: Any, planes: int, stride: int, project: bool, name: str, zero_init_residual: bool) -> Any:
    out = layers.ReLU(name=f"{name}.relu1")(_bn(_conv(x, planes, 1, 1, f"{name}.conv1"), f"{name}.bn1"))
    out = layers.ReLU(name=f"{name}.relu2")(_bn(_conv(out, planes, 3, stride, f"{name}.conv2"), f"{name}.bn2"))
    out = _bn(_conv(out, planes * 4, 1, 1, f"{name}.conv3"), f"{name}.bn3", zero_init_residual)
    return _merge(x, out, planes * 4, stride, project, name)


def _merge(x: Any, out: Any, channels: int, stride: int, project: bool, name: str) -> Any:
    shortcut = x
    if project:
        shortcut = _bn(_conv(x, channels, 1, stride, f"{name}.downsample.0"), f"{name}.downsample.1")
    return layers.ReLU(name=f"{name}.relu")(layers.Add(name=f"{name}.add")([out, shortcut]))


_BLOCKS: dict[str, tuple[Callable[..., Any], int]] = {"basic": (_basic_block, 1), "bottleneck": (_bottleneck, 4)}


def build_model(
    name: str, num_classes: int, image_size: int | None = None, zero_init_residual: bool = False
) -> keras.Model:
    """The named ResNet as a functional ``keras.Model`` mapping NHWC float images to logits.

    ``image_size`` fixes the input's spatial size (None accepts any); ``zero_init_residual``
    starts each residual branch's last BatchNorm at gamma=0 (Goyal et al., sec. 5.1).
    """
    if name not in MODELS:
        # ValueError, not KeyError: callers pass user input and the message lists the choices
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    kind, depths = MODELS[name]
    block, expansion = _BLOCKS[kind]
    images = keras.Input((image_size, image_size, 3), name="images")
    x = layers.ReLU(name="relu")(_bn(_conv(images, 64, 7, 2, "conv1"), "bn1"))
    x = layers.MaxPooling2D(3, strides=2, name="maxpool")(layers.ZeroPadding2D(1, name="maxpool.pad")(x))
    channels = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), depths, strict=True), start=1):
        for i in range(blocks):
            stride = 2 if stage > 1 and i == 0 else 1
            project = i == 0 and (stride != 1 or channels != planes * expansion)
            x = block(x, planes, stride, project, f"layer{stage}.{i}", zero_init_residual)
            channels = planes * expansion
    x = layers.GlobalAveragePooling2D(name="avgpool")(x)
    # nn.Linear's default init: weights and bias uniform in +-1/sqrt(fan_in)
    bound = 1.0 / math.sqrt(channels)
    logits = layers.Dense(
        num_classes,
        dtype="float32",
        name="fc",
        kernel_initializer=keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )(x)
    return keras.Model(images, logits, name=name)
