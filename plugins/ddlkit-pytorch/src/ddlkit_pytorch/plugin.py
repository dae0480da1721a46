"""ddlkit hooks for PyTorch (the entry-point target; imports no torch)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from .framework import PytorchConfig, PytorchFramework


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("pytorch", PytorchFramework, config=PytorchConfig,
                              description="PyTorch: ResNet-18..152, SGD, bf16/fp16 autocast")
