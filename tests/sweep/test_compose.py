"""The launcher reuses the configs Hydra's sweeper composed to validate the batch."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from ddlkit.sweep.compose import SharedCompositions


class CountingLoader:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def load_sweep_config(self, master_config: Any, sweep_overrides: list[str]) -> Any:
        self.calls.append(list(sweep_overrides))
        return OmegaConf.create({"overrides": list(sweep_overrides)})


def test_each_config_the_sweeper_composed_is_taken_once_then_composed_again() -> None:
    loader, master = CountingLoader(), OmegaConf.create({})
    SharedCompositions.install(loader)
    SharedCompositions.install(loader)  # idempotent: one wrapper, not two
    shared = loader.load_sweep_config
    built = shared(master_config=master, sweep_overrides=["a=1"])  # what validate_batch_is_legal does
    assert shared.take(master, ["a=1"]) is built
    assert len(loader.calls) == 1
    again = shared.take(master, ["a=1"])  # given out once only: a second take composes anew
    assert again is not built and again == built and len(loader.calls) == 2
    assert shared.take(master, ["b=2"]).overrides == ["b=2"]  # never composed by the sweeper
    assert loader.calls == [["a=1"], ["a=1"], ["b=2"]]


def test_a_different_master_config_is_never_mixed_up() -> None:
    loader = CountingLoader()
    SharedCompositions.install(loader)
    one, other = OmegaConf.create({"m": 1}), OmegaConf.create({"m": 2})
    loader.load_sweep_config(one, ["a=1"])
    loader.load_sweep_config.take(other, ["a=1"])
    assert len(loader.calls) == 2

