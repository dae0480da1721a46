"""ddlkit hooks for PyTorch (the entry-point target; imports no torch)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import ddlkit
from ddlkit import threads

from . import components


@ddlkit.hookimpl
def ddlkit_frameworks() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "pytorch",
        "ddlkit_pytorch.framework:PytorchFramework",
        config="ddlkit_pytorch.framework:PytorchConfig",
        packages=("torch", "horovod"),
        description="PyTorch: bf16/fp16 autocast, channels_last, torch.compile",
    )


@ddlkit.hookimpl
def ddlkit_models() -> Iterator[ddlkit.Registration]:
    yield from components.models()


@ddlkit.hookimpl
def ddlkit_optimizers() -> Iterator[ddlkit.Registration]:
    yield from components.optimizers()


@ddlkit.hookimpl
def ddlkit_configure(config: Any) -> None:
    # a transformer's image size, checked in the launcher when the data's config states it (the
    # rank checks it again against what the data source reports)
    if config.framework.name == "pytorch" and config.model.name in components.PATCH_SIZES:
        image_size = config.data.get("image_size")
        if isinstance(image_size, int):
            components.check_image_size(config.model.name, image_size)


@ddlkit.hookimpl
def ddlkit_job_environment(config: Any) -> Mapping[str, str] | None:
    # torch's OpenMP reads its wait policy once, when torch is imported: the ranks' environment has it
    if config.framework.name == "pytorch":
        return threads.rank_environment(config.framework.num_threads)
    return None
