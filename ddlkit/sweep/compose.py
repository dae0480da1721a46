"""Composing one job of a sweep in the launcher process, as Hydra's basic launcher does."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


class SharedCompositions:
    """Hands the launcher the job configs Hydra's sweeper has just composed and thrown away.

    Hydra's sweeper composes every job of a batch to check that it can be composed
    (``Sweeper.validate_batch_is_legal``), discards the configs, and passes the overrides to the
    launcher, which composes each job again. Composing takes ~0.15 s per job, and a sweep starts
    its first job only when all are composed (a bad value in any job must stop the sweep before
    any starts), so the second round delays every sweep by that much per job. Installed as the
    config loader's ``load_sweep_config`` (what the sweeper calls), it keeps what it builds;
    :meth:`take` gives each config out once, or composes one when the sweeper did not."""

    #: configs kept at most (an enormous sweep composes the rest again rather than hold them all)
    MAX_KEPT = 1024

    def __init__(self, load: Callable[[DictConfig, list[str]], DictConfig]) -> None:
        self._load = load
        self._kept: dict[tuple[int, tuple[str, ...]], DictConfig] = {}

    @classmethod
    def install(cls, config_loader: Any) -> None:
        if not isinstance(config_loader.load_sweep_config, cls):
            config_loader.load_sweep_config = cls(config_loader.load_sweep_config)

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        config = self._load(master_config, sweep_overrides)
        if len(self._kept) < self.MAX_KEPT:
            self._kept[(id(master_config), tuple(sweep_overrides))] = config
        return config

    def take(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept = self._kept.pop((id(master_config), tuple(sweep_overrides)), None)
        return kept if kept is not None else self._load(master_config, sweep_overrides)


def compose_job(hydra_context: HydraContext, base: DictConfig, overrides: Sequence[str], num: int) -> ComposedJob:
    """The job's config, built like Hydra's basic launcher and ``run_job`` build it (the same output dir)."""
    load = hydra_context.config_loader.load_sweep_config
    config = (load.take if isinstance(load, SharedCompositions) else load)(base, list(overrides))
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
