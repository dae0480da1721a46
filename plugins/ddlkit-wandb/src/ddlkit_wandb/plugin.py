"""ddlkit hooks for W&B (the entry-point target; imports no wandb)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.util import find_spec
from typing import TYPE_CHECKING

import ddlkit

from .logger import MODES, WandbConfig, WandbLogger

if TYPE_CHECKING:
    from omegaconf import DictConfig


@ddlkit.hookimpl
def ddlkit_loggers() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("wandb", WandbLogger, config=WandbConfig,
                              description="Weights & Biases: one run per job, grouped by sweep; offline without a key")


@ddlkit.hookimpl
def ddlkit_configure(config: DictConfig) -> None:
    cfg = (config.get("logger") or {}).get("wandb")
    if cfg is None:
        return
    if find_spec("wandb") is None:
        raise ddlkit.ConfigError("logger=wandb needs the wandb package: pip install wandb (or drop wandb from logger).")
    if cfg.mode not in MODES:
        raise ddlkit.ConfigError(f"logger.wandb.mode={cfg.mode} is invalid: it must be one of {', '.join(MODES)}.")
    if cfg.log_model and not config.trainer.save_model:
        raise ddlkit.ConfigError("logger.wandb.log_model=true uploads the trained model, which "
                                 "trainer.save_model=false does not write; set one of them differently.")


#: what wandb reads from the environment on rank 0: the key, where to log, and how
RANK_ENV = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_DIR")


@ddlkit.hookimpl
def ddlkit_job_environment(config: DictConfig) -> dict[str, str] | None:
    """Rank 0 may run on another machine: pass on the W&B variables set here (the API key
    travels as a secret, never in a file)."""
    if (config.get("logger") or {}).get("wandb") is None:
        return None
    return {k: os.environ[k] for k in RANK_ENV if k in os.environ}
