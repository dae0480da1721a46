"""ResNet-18/34/50/101/152 written against plain PyTorch.

Why this module exists: the available torchvision wheels do not load against
the CPU build of torch installed here (each torchvision release is built for
one specific torch release), so ``torchvision.models`` cannot be used. Only
the ResNet family is needed, so it is defined here with nothing but ``torch``.

The module tree -- attribute names, registration order, layer shapes,
``bias=False`` on every convolution -- deliberately mirrors
``torchvision.models.resnet`` so that ``state_dict()`` keys and tensor shapes
are identical. That keeps checkpoints interchangeable in both directions: a
torchvision checkpoint loads with ``load_state_dict(..., strict=True)`` here,
and weights trained here load into torchvision elsewhere. Renaming or
reordering any submodule below would silently break that contract, which the
tests guard.

The Bottleneck puts its stride on the 3x3 ``conv2`` (the "ResNet v1.5" variant
torchvision ships) rather than on ``conv1`` as in the original paper; only the
placement of the stride differs, so shapes match either way, but numerics match
torchvision only with the v1.5 placement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "BLOCKS", "MODELS", "build_model", "AutocastForward"]


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv is followed by BatchNorm, whose shift makes a conv
    # bias redundant -- and torchvision's checkpoints have no "*.bias" for convs.
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity (or projected) shortcut; used by ResNet-18/34."""

    expansion: int = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        # Attribute names and their assignment order define the state_dict
        # keys/ordering; they must stay exactly as in torchvision.
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x

        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 -> 1x1 expand (x4) block; used by ResNet-50/101/152."""

    expansion: int = 4

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        width = planes
        self.conv1 = _conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        # Stride on the 3x3 conv (ResNet v1.5, as torchvision): striding a 1x1
        # conv would simply discard 3/4 of the activations, which costs accuracy.
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x

        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        return self.relu(out)


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    """ResNet backbone + linear classifier, module tree identical to torchvision's."""

    def __init__(
        self,
        block: Block,
        layers: Sequence[int],
        num_classes: int = 1000,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"layers must have 4 entries, got {len(layers)}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")

        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        # Adaptive pooling (not a fixed 7x7 AvgPool) so any input size works,
        # down to 32x32 where layer4 produces a 1x1 map.
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        # Same init as torchvision so freshly built models train comparably;
        # fan_out keeps the backward-pass variance stable through ReLUs.
        # nn.Linear keeps PyTorch's default init, as in torchvision.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

        # Zeroing the last BN of each residual branch makes every block start
        # as the identity, which helps large-batch training
        # (Goyal et al., https://arxiv.org/abs/1706.02677).
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, block: Block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample: nn.Module | None = None
        # A projection shortcut is needed whenever the residual branch changes
        # spatial size or channel count; otherwise the plain identity is used.
        # It must be an nn.Sequential so its keys are "downsample.0"/"downsample.1".
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )

        layers: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, zero_init_residual)


def resnet34(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, zero_init_residual)


def resnet50(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, zero_init_residual)


def resnet101(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes, zero_init_residual)


def resnet152(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    return ResNet(Bottleneck, [3, 8, 36, 3], num_classes, zero_init_residual)


#: the blocks of these models: what dist=fsdp shards, and activation checkpointing recomputes, one by one
BLOCKS: tuple[type[nn.Module], ...] = (BasicBlock, Bottleneck)

MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "resnet152": resnet152,
}


def build_model(name: str, num_classes: int = 1000, zero_init_residual: bool = False) -> nn.Module:
    """Build the named ResNet with torchvision-compatible parameter names."""
    factory = MODELS.get(name)
    if factory is None:
        # ValueError rather than the dict's KeyError: callers pass user input
        # (CLI/config), and the message should say what would have worked.
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return factory(num_classes=num_classes, zero_init_residual=zero_init_residual)


class AutocastForward(nn.Module):
    """Runs ``module`` under ``torch.autocast(device_type, dtype)``: what ``framework.compile`` compiles
    when a run autocasts, so that the dtype is part of the compiled graph.

    Compiled under an *ambient* autocast instead, torch 2.11 (CUDA 13) reuses a cached graph
    compiled for another autocast dtype: an fp16 run after a bf16 one (in the same process, even
    after ``torch._dynamo.reset()``, or in any process sharing the inductor cache) silently
    computes in bf16. Holds no parameters of its own: ``module``'s state_dict is unchanged.
    """

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module, self.device_type, self.dtype = module, device_type, dtype

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(x)
