"""A user's own model for the dist=fsdp tests (``model=custom model.target=fsdp_models:mlp``):
residual blocks of a class ddlkit does not know (``framework.fsdp_blocks=[Block]``), and no
BatchNorm, whose per-rank statistics would make a run on 2 ranks differ from one on 1 rank."""

from __future__ import annotations

import os

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


class _FailsOnce:
    """A value the checkpoint pickles (on the one rank DCP gives it to), whose pickling raises as
    long as ``marker`` exists, which it then removes: one checkpoint's write fails on one rank, once."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[type, tuple[str]]:
        if os.path.exists(self.marker):
            os.remove(self.marker)
            raise OSError(f"a write that fails once (test: {self.marker})")
        return (_FailsOnce, (self.marker,))


class MLPWithExtraState(MLP):
    def __init__(self, marker: str, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.fails = _FailsOnce(marker)

    def get_extra_state(self) -> _FailsOnce:  # in the state dict as "_extra_state"
        return self.fails

    def set_extra_state(self, state: _FailsOnce) -> None:
        self.fails = state


def mlp_failing_once(marker: str, image_size: int = 16) -> MLPWithExtraState:
    """:func:`mlp` whose checkpoint write fails once while ``marker`` exists."""
    return MLPWithExtraState(marker, inputs=3 * image_size * image_size, width=64, depth=3, classes=10)
