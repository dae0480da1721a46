"""Composing one job of a sweep in the launcher process, as Hydra's basic launcher does."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, flag_override, open_dict, read_write

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from hydra.types import HydraContext


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
def hydra_config_of(config: Any) -> Iterator[None]:
    """Make ``config`` (anything with a ``hydra`` node) the current HydraConfig, so that
    ``${hydra:...}`` resolves as in the job, then restore. It is set as is, not copied as
    ``HydraConfig.set_config`` copies it: a sweep does this for every job."""
    instance = HydraConfig.instance()
    saved, instance.cfg = instance.cfg, config
    try:
        yield
    finally:
        instance.cfg = saved


class SharedCompositions:
    """Composes a sweep's jobs once each, and most of them without Hydra's composition at all.

    Hydra's basic sweeper composes every job (``Sweeper.validate_batch_is_legal``) and throws the
    configs away; the launcher composes each job again to validate it before any starts, and once more when it
    starts. A full composition takes ~0.1 s, so a 1,000-job sweep spent minutes composing before its first job ran.
    Installed as the config loader's ``load_sweep_config`` (what the sweeper calls), this composes in full only the
    first job of each *shape*: jobs that differ from it only in the values they give existing keys
    (``optimizer.lr=0.1`` vs ``0.2``, the same other overrides; no dict or list value) are that config with their
    values set -- by Hydra's own override code, so a bad value fails as it would in a full composition -- and with
    the Hydra fields that depend on the overrides (``hydra.overrides.task``, ``hydra.job.override_dirname``) set to
    theirs.

    :meth:`__call__` (the sweeper's check, see there) and :meth:`shared` return the shape's one config,
    changed in place for each job: valid until the next call, for callers that only read it at
    once. :meth:`take` returns a config of the job's own."""

    def __init__(self, load: Callable[[DictConfig, list[str]], DictConfig]) -> None:
        self._load = load
        #: per (master config, shape): the shape's config, or None when its value keys are not all values
        self._shapes: dict[tuple[int, tuple[str, ...]], DictConfig | None] = {}
        self._parsed: dict[str, Override] = {}

    @classmethod
    def install(cls, config_loader: Any) -> None:
        if not isinstance(config_loader.load_sweep_config, cls):
            config_loader.load_sweep_config = cls(config_loader.load_sweep_config)

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig | None:
        """The sweeper's check of a job, before it hands the batch to the launcher: a job that does
        not compose is left to the launcher, which composes every job again and reports all that
        fail, each with its number (and ``ddlkit plan`` then removes what the sweeper wrote)."""
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        try:
            return self.shared(master_config, sweep_overrides)
        except (HydraException, OmegaConfBaseException):
            return None

    def shared(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        shape = _shape([self._parse(o) for o in sweep_overrides])
        if shape is None:
            return self._load(master_config, list(sweep_overrides))
        key, parsed, values = shape
        key = (id(master_config), key)
        if key not in self._shapes:
            config = self._load(master_config, list(sweep_overrides))
            self._shapes[key] = config if all(_is_value(config, o.key_or_group) for o in values) else None
            return config
        config = self._shapes[key]
        if config is None:
            return self._load(master_config, list(sweep_overrides))
        _set_values(config, parsed, values)
        return config

    def take(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        return copy.deepcopy(self.shared(master_config, sweep_overrides))

    def _parse(self, text: str) -> Override:
        """Each distinct override parsed once: a sweep's jobs repeat most of theirs."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if text not in self._parsed:
            self._parsed[text] = OverridesParser.create().parse_override(text)
        return self._parsed[text]


def _shape(parsed: list[Override]) -> tuple[tuple[str, ...], list[Override], list[Override]] | None:
    """A job's shape -- its overrides with the values of its value overrides (``a.b=1``) left
    out -- with those value overrides; None when it has a Hydra override or two overrides of
    one key."""
    from hydra.core.override_parser.types import OverrideType, QuotedString

    shape, values = [], []
    for o in parsed:
        key = o.key_or_group
        if o.is_hydra_override():
            return None
        if (
            o.type is OverrideType.CHANGE
            and o.package is None
            and "." in key
            and "/" not in key
            and not o.is_sweep_override()
            and isinstance(o.value(), (str, int, float, bool, QuotedString, type(None)))
        ):
            shape.append(f"{key}=")
            values.append(o)
        else:
            shape.append(o.input_line or "")
    keys = [o.key_or_group for o in parsed]
    if len(set(keys)) != len(keys):
        return None
    return tuple(shape), parsed, values


def _is_value(config: DictConfig, key: str) -> bool:
    node = OmegaConf.select(config, key, default=None, throw_on_missing=False)
    parent, _, last = key.rpartition(".")
    holder = OmegaConf.select(config, parent, default=None)
    return not OmegaConf.is_config(node) and isinstance(holder, DictConfig) and last in holder


def _set_values(config: DictConfig, parsed: list[Override], values: list[Override]) -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname

    ConfigLoaderImpl._apply_overrides_to_config(values, config)
    job = config.hydra.job
    with read_write(config.hydra):
        config.hydra.overrides.task = [o.input_line for o in parsed]
        job.override_dirname = get_overrides_dirname(
            overrides=parsed,
            exclude_keys=list(job.config.override_dirname.exclude_keys),
            item_sep=job.config.override_dirname.item_sep,
            kv_sep=job.config.override_dirname.kv_sep,
        )


def compose_job(hydra_context: HydraContext, base: DictConfig, overrides: Sequence[str], num: int) -> ComposedJob:
    """The job's config, built like Hydra's basic launcher and ``run_job`` build it (the same output dir)."""
    load = hydra_context.config_loader.load_sweep_config
    config = (load.take if isinstance(load, SharedCompositions) else load)(base, list(overrides))
    _number(config, num)
    return ComposedJob(num, list(overrides), config)


@contextlib.contextmanager
def job_view(
    hydra_context: HydraContext, base: DictConfig, overrides: Sequence[str], num: int
) -> Iterator[tuple[DictConfig, Path]]:
    """The job's task config (its ``hydra`` node set aside, and current as HydraConfig) and its
    output directory, to read within the ``with`` only: the config may be the one
    :class:`SharedCompositions` changes in place for the next job of the same shape. What a
    sweep uses to check each job before any starts, without a copy of each job's config."""
    load = hydra_context.config_loader.load_sweep_config
    config = (load.shared if isinstance(load, SharedCompositions) else load)(base, list(overrides))
    output_dir = _number(config, num)
    hydra = config._get_node("hydra")
    with read_write(config), open_dict(config):
        del config["hydra"]
    # detached, so that setting it back does not copy it (OmegaConf copies a node of the same config)
    hydra._set_parent(None)
    try:
        with hydra_config_of(SimpleNamespace(hydra=hydra)):
            yield config, output_dir
    finally:
        with read_write(config), open_dict(config), flag_override(config, "no_deepcopy_set_nodes", True):
            config["hydra"] = hydra


def _number(config: DictConfig, num: int) -> Path:
    """Give the job its number, and its output directory from the sweep dir and subdir."""
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.job.id = num
        config.hydra.job.num = num
    with hydra_config_of(config):
        # the subdir is resolved lazily, per job: it may use ${hydra.job.num} or ${hydra.job.override_dirname};
        # Hydra's default is read without OmegaConf's grammar, which takes milliseconds per job
        subdir = config.hydra.sweep._get_node("subdir")._value()
        subdir = str(num) if subdir == "${hydra.job.num}" else str(OmegaConf.select(config, "hydra.sweep.subdir"))
        output_dir = os.path.abspath(os.path.join(str(OmegaConf.select(config, "hydra.sweep.dir")), subdir))
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = output_dir
    return Path(output_dir)
