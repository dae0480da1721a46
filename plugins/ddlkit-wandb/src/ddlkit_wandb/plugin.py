"""ddlkit hooks for W&B (the entry-point target; imports no wandb)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import ddlkit

if TYPE_CHECKING:
    from omegaconf import DictConfig


@ddlkit.hookimpl
def ddlkit_loggers() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "wandb",
        "ddlkit_wandb.logger:WandbLogger",
        config="ddlkit_wandb.logger:WandbConfig",
        packages=("wandb",),
        description="Weights & Biases: one run per job, grouped by sweep; offline without a key",
    )


#: what wandb reads from the environment on rank 0: the key, where to log, and how
RANK_ENV = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_DIR")


@ddlkit.hookimpl
def ddlkit_job_environment(config: DictConfig) -> dict[str, str] | None:
    """Rank 0 may run on another machine: pass on the W&B variables set here (the API key
    travels as a secret, never in a file)."""
    if (config.get("logger") or {}).get("wandb") is None:
        return None
    return {k: os.environ[k] for k in RANK_ENV if k in os.environ}
