"""Composing one job of a sweep in the launcher process, as Hydra's basic launcher does."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict, read_write

if TYPE_CHECKING:
    from hydra.types import HydraContext
    from omegaconf import DictConfig


@dataclass(frozen=True)
class ComposedJob:
    #: hydra.job.num (and hydra.job.id)
    num: int
    #: the job's task overrides, as the sweeper expanded them
    overrides: list[str]
    #: the job's whole config, ``hydra`` node included, with hydra.runtime.output_dir filled in
    config: DictConfig

    @property
    def output_dir(self) -> Path:
        return Path(self.config.hydra.runtime.output_dir)

    def task_config(self) -> DictConfig:
        """What the task function gets: the config without the ``hydra`` node."""
        cfg = copy.deepcopy(self.config)
        with read_write(cfg), open_dict(cfg):
            del cfg["hydra"]
        return cfg

    def hydra_config(self) -> DictConfig:
        """The ``{hydra: ...}`` config Hydra's own JobReturn carries."""
        return OmegaConf.masked_copy(self.config, "hydra")


@contextlib.contextmanager
def hydra_config_of(config: DictConfig) -> Iterator[None]:
    """Make ``config`` the current HydraConfig (so ``${hydra:...}`` resolves as in the job), then restore."""
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(config)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = saved


def compose_job(hydra_context: HydraContext, base: DictConfig, overrides: Sequence[str], num: int) -> ComposedJob:
    """The job's config, built like Hydra's basic launcher and ``run_job`` build it (the same output dir)."""
    config = hydra_context.config_loader.load_sweep_config(base, list(overrides))
    with open_dict(config):
        config.hydra.job.id = num
        config.hydra.job.num = num
    with hydra_config_of(config):
        # the subdir is resolved lazily, per job: it may use ${hydra.job.num} or ${hydra.job.override_dirname}
        output_dir = os.path.join(str(OmegaConf.select(config, "hydra.sweep.dir")),
                                  str(OmegaConf.select(config, "hydra.sweep.subdir")))
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = os.path.abspath(output_dir)
    return ComposedJob(num, list(overrides), config)
