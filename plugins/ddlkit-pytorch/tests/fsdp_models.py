"""A user's own model for the dist=fsdp tests (``model=custom model.target=fsdp_models:mlp``):
residual blocks of a class ddlkit does not know (``framework.fsdp_blocks=[Block]``), and no
BatchNorm, whose per-rank statistics would make a run on 2 ranks differ from one on 1 rank."""

from __future__ import annotations

from torch import Tensor, nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, inputs: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(inputs, width))
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))


def mlp(image_size: int = 16, width: int = 64, depth: int = 3, classes: int = 10) -> MLP:
    return MLP(3 * image_size * image_size, width, depth, classes)
