"""The launcher's checks of a composed run, before anything is written: the shape of the config
and each option's own constraint, each selected component's own ``configure``, the frameworks'
models and optimizers, and the compute target's ranks against the dist settings and the data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from .. import callbacks, monitor, options
from ..checkpoint import resume_path
from ..config import check_one_global_batch, to_container
from ..custom import launch_dir
from ..errors import ConfigError
from ..interfaces import ComputeTarget, Framework, StorageBackend
from ..profiling import check_window
from ..registry import HOOK_POINTS, Registry
from . import elastic
from .hydra_errors import check_composed

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..plugins import DdlkitPluginManager


def build_target(cfg: DictConfig, registry: Registry) -> ComputeTarget:
    """The job's compute target: built once per job, from ``cfg.compute``."""
    check_composed(cfg, registry)  # a preset's node gets its plugin's schema before it is read
    return registry.create("compute", cfg.compute.name, cfg.compute)


def validate(
    cfg: DictConfig, registry: Registry, pm: DdlkitPluginManager, *, compute: ComputeTarget | None = None
) -> dict[str, Any]:
    """Check the composed config before anything runs; return it resolved as plain containers.
    ``compute``: the job's target, when the caller has built it already."""
    check_composed(cfg, registry)
    registry.selected(cfg)  # every name is known, and the framework implements the model and optimizer
    try:
        container = to_container(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key
        raise ConfigError(f"missing value for `{key}`: set it on the command line, e.g. {key}=<value>.") from None
    except OmegaConfBaseException as err:
        raise ConfigError(f"config error at `{getattr(err, 'full_key', '?')}`: {err.msg}") from None

    # every option's own constraint, declared on its schema's field (ddlkit.options)
    options.check(cfg)
    monitor.check(cfg)
    callbacks.resolve(cfg.trainer.callbacks)
    compute = compute or build_target(cfg, registry)
    _check_distributed(cfg, compute, registry)
    for component in _selected(cfg, registry, compute):
        if isinstance(component, Framework):
            _check_backend(cfg, component)
        component.configure(cfg)
        if isinstance(component, Framework) and compute.ranks_share_environment:
            component.check_environment(cfg)  # else the ranks check it where they run
        if isinstance(component, StorageBackend) and compute.shares_job_dir:
            _launch_relative(container, component)
    # what no one component owns: checks across the config (user code importable, ...)
    pm.hook.ddlkit_configure(config=cfg)
    return container


def _check_backend(cfg: DictConfig, framework: Framework) -> None:
    """``dist.backend`` is one the selected framework trains with."""
    backend = cfg.dist.backend
    if backend not in framework.backends:
        others = " or ".join(f"dist={b}" for b in framework.backends if b != "none")
        raise ConfigError(f"framework={cfg.framework.name} does not train with dist={backend}: use {others}.")


def _launch_relative(container: dict[str, Any], storage: StorageBackend) -> None:
    """Paths the user gave relative to where ``ddlkit`` was started, made absolute for ranks that
    run in the job directory on this disk: ``data.root`` (as the storage reads it) and a
    ``trainer.resume`` checkpoint."""
    here = launch_dir()
    data = container.get("data") or {}
    if isinstance(data.get("root"), str):
        data["root"] = storage.launch_relative(data["root"], here)
    trainer = container.get("trainer") or {}
    resume = trainer.get("resume")
    if isinstance(resume, str) and resume_path(resume) and not Path(resume).expanduser().is_absolute():
        trainer["resume"] = str(here / resume)  # the launcher checks it from here too (prepare)


def _selected(cfg: DictConfig, registry: Registry, compute: ComputeTarget) -> Iterator[Any]:
    """The selected components, built as the ranks will build them, each to check its own options
    (``configure``); models and optimizers are the framework's to check."""
    for group, entry in registry.selected(cfg):
        hp, name = HOOK_POINTS[group], entry.registration.name
        if hp.per_framework:
            continue
        node = cfg[group][name] if hp.multi else cfg[group]
        yield compute if group == "compute" else registry.create(group, name, node)


def _check_distributed(cfg: DictConfig, compute: ComputeTarget, registry: Registry) -> None:
    """The dist settings and the data against the compute target's number of ranks."""
    world_size = compute.world_size
    # an elastic job (compute.min_nodes) can apply trainer.on_resize on every world size it may shrink to
    elastic.check(compute, {"trainer": cfg.trainer})
    if world_size > 1 and cfg.dist.backend == "none":
        raise ConfigError(
            f"compute={cfg.compute.name} runs {world_size} ranks, which must share their gradients: "
            "add dist=native (the framework's own collectives) or dist=horovod."
        )
    # every rank checks the data against the global batch once the data is readable; a source
    # whose config states its size is checked here as well, before anything starts
    stated = registry.create("data", cfg.data.name, cfg.data).config_info()
    if stated is not None:
        t = cfg.trainer
        check_one_global_batch(stated.train_length, t.batch_size, t.accumulate_batches, world_size)
    _check_profile(cfg.trainer, stated.train_length if stated is not None else None, world_size)


def _check_profile(trainer: Any, train_length: int | None, world_size: int) -> None:
    """``trainer.profile``'s window ends within the run: its total steps where the data source states
    its length, else within ``trainer.max_steps`` (the ranks check the rest once the data is readable)."""
    t = trainer
    if train_length is not None:
        global_batch = t.batch_size * world_size * t.accumulate_batches
        per_epoch = train_length // global_batch
        total, why = per_epoch * t.epochs, f"{t.epochs} epochs x {per_epoch} steps"
        if t.max_steps is not None and t.max_steps < total:
            total, why = t.max_steps, "trainer.max_steps"
        check_window(t.profile, total, why)
    elif t.max_steps is not None:
        check_window(t.profile, t.max_steps, "trainer.max_steps")
