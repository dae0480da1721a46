"""A sweep composes each shape of job once in full; jobs that only change values get them set."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf

from ddlkit.config import store_schemas
from ddlkit.launch.sweep.compose import SharedCompositions
from ddlkit.registry import Registry
from ddlkit.testing import FAKES_MODULE, add_plugin, fakes


class CountingLoad:
    """Hydra's own load_sweep_config, counted."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.calls = loader, 0

    def __call__(self, master_config: Any, sweep_overrides: list[str]) -> Any:
        self.calls += 1
        return self.loader.load_sweep_config(master_config, sweep_overrides)


@pytest.fixture
def hydra_loader(ddlkit_pm: Any) -> Iterator[tuple[Any, Any]]:
    """Hydra's config loader for ddlkit's config, and a sweep's master config."""
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    store_schemas(Registry.collect(ddlkit_pm))
    with initialize_config_module("ddlkit.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        yield loader, loader.load_configuration("config", ["framework=fake"], run_mode=RunMode.MULTIRUN)


def plain(config: Any) -> dict[str, Any]:
    return OmegaConf.to_container(config, resolve=False)


def test_value_only_jobs_equal_full_compositions_and_are_composed_once(hydra_loader: tuple[Any, Any]) -> None:
    loader, master = hydra_loader
    load = CountingLoad(loader)
    shared = SharedCompositions(load)
    jobs = [
        ["framework=fake", f"optimizer.lr={lr}", f"trainer.seed={seed}", "data.name='synthetic'"]
        for lr in (0.1, 0.2, 0.3)
        for seed in (1, 2)
    ]
    taken = [shared.take(master, job) for job in jobs]
    assert load.calls == 1  # one shape: composed once, the other five jobs got their values set
    for job, config in zip(jobs, taken, strict=True):
        assert plain(config) == plain(loader.load_sweep_config(master, job)), job
    assert len({id(c) for c in taken}) == len(jobs)  # take() gives each job a config of its own
    assert [c.optimizer.lr for c in taken] == [0.1, 0.1, 0.2, 0.2, 0.3, 0.3]


def test_the_sweepers_check_and_the_launchers_view_share_one_config_per_shape(hydra_loader: tuple[Any, Any]) -> None:
    loader, master = hydra_loader
    load = CountingLoad(loader)
    shared = SharedCompositions(load)
    first = shared(master, ["framework=fake", "optimizer.lr=0.1"])
    second = shared.shared(master, ["framework=fake", "optimizer.lr=0.2"])
    assert second is first and second.optimizer.lr == 0.2
    assert list(second.hydra.overrides.task) == ["framework=fake", "optimizer.lr=0.2"]
    assert second.hydra.job.override_dirname == "framework=fake,optimizer.lr=0.2"
    assert load.calls == 1


def test_other_overrides_are_composed_in_full(hydra_loader: tuple[Any, Any]) -> None:
    loader, master = hydra_loader
    load = CountingLoad(loader)
    shared = SharedCompositions(load)
    for job in (
        ["model=resnet18"],
        ["model=resnet34"],
        ["+trainer.max_steps=3"],
        ["optimizer.decay_epochs=[1,2]"],
        ["optimizer.decay_epochs=[3]"],
    ):
        job = ["framework=fake", *job]
        assert plain(shared.take(master, job)) == plain(loader.load_sweep_config(master, job))
    assert load.calls == 5  # a group, an add, list values: each its own shape, composed by Hydra


def test_a_bad_value_fails_as_in_a_full_composition(hydra_loader: tuple[Any, Any]) -> None:
    loader, master = hydra_loader
    shared = SharedCompositions(CountingLoad(loader))
    shared(master, ["framework=fake", "trainer.batch_size=8"])
    with pytest.raises(ConfigCompositionException, match="Error merging override trainer.batch_size=abc"):
        shared.shared(master, ["framework=fake", "trainer.batch_size=abc"])
    # the sweeper's check leaves it to the launcher, which reports every job that fails (issue 23, item 4)
    assert shared(master, ["framework=fake", "trainer.batch_size=abc"]) is None
    with pytest.raises(ConfigCompositionException, match="Error merging override trainer.batch_size=abc"):
        loader.load_sweep_config(master, ["framework=fake", "trainer.batch_size=abc"])


def test_install_is_idempotent() -> None:
    class Loader:
        def load_sweep_config(self, master_config: Any, sweep_overrides: list[str]) -> Any:
            return OmegaConf.create()

    loader = Loader()
    SharedCompositions.install(loader)
    wrapper = loader.load_sweep_config
    SharedCompositions.install(loader)
    assert loader.load_sweep_config is wrapper


def test_hydra_still_composes_a_sweeps_jobs_through_load_sweep_config() -> None:
    """SharedCompositions replaces the config loader's ``load_sweep_config``, which Hydra's sweepers
    call for every job (``Sweeper.validate_batch_is_legal``): a recorded decision (a 1,000-job
    ``ddlkit plan`` took 8.9 s with it, 106 s without; benchmarks/plan.py). Should a Hydra release
    rename the method, change its arguments or stop calling it, this fails, instead of sweeps
    silently composing every job three times again."""
    import inspect

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.plugins.sweeper import Sweeper

    assert list(inspect.signature(ConfigLoaderImpl.load_sweep_config).parameters) == [
        "self",
        "master_config",
        "sweep_overrides",
    ]
    # ... with these keywords, which SharedCompositions.__call__ takes by the same names
    calls = inspect.getsource(Sweeper.validate_batch_is_legal)
    assert "config_loader.load_sweep_config(" in calls and "master_config=" in calls and "sweep_overrides=" in calls
    assert list(inspect.signature(SharedCompositions.__call__).parameters) == [
        "self",
        "master_config",
        "sweep_overrides",
    ]
