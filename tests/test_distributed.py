"""Where a rank learns its place: OpenMPI, torchrun, or a single process; what one process pays
(nothing); and the dist settings' checks."""

from __future__ import annotations

import threading

import pytest

import ddlkit
from ddlkit import DistContext
from ddlkit.launch.validate import validate
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.registry import Registry
from ddlkit.testing import FAKES_MODULE, add_plugin, compose, fakes, with_default_framework


def test_a_single_process_by_default() -> None:
    ctx = DistContext.from_env(env={})
    assert ctx == DistContext(0, 1, 0, 1, 0, "none")
    assert ctx.is_main and ctx.is_local_main
    assert ctx.allreduce_mean({"loss": 2.0}) == {"loss": 2.0}


def test_openmpi_variables_win_over_torchrun() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    ctx = DistContext.from_env("horovod", env)
    assert ctx == DistContext(rank=5, world_size=8, local_rank=1, local_size=4, node=1, backend="horovod")
    assert not ctx.is_main and not ctx.is_local_main


def test_torchrun_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert DistContext.from_env("native", env) == DistContext(3, 4, 1, 2, 1, "native")


def test_collectives_of_several_ranks_need_a_connection() -> None:
    with pytest.raises(ddlkit.RunError, match=r"dist\.backend=native: barrier across 2 ranks before"):
        DistContext(0, 2, backend="native").barrier()


def test_one_process_starts_no_thread_for_liveness() -> None:
    before = threading.active_count()
    ctx = DistContext.from_env(env={}, warn_after_s=1.0)
    ctx.connect("job", env={})
    ctx.track_step(lambda: 3)
    ctx.barrier()
    assert ctx.silent_ranks() == []
    assert threading.active_count() == before


@pytest.mark.parametrize("value", ["0", "0.5", "-60"])
def test_the_silence_before_a_warning_must_be_at_least_a_second(ddlkit_pm: DdlkitPluginManager, value: str) -> None:
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    registry = Registry.collect(ddlkit_pm)
    with pytest.raises(ddlkit.ConfigError) as info:
        validate(compose(registry, with_default_framework([f"dist.warn_after_s={value}"])), registry, ddlkit_pm)
    assert str(info.value) == f"dist.warn_after_s={float(value)} is invalid: it must be at least 1 (seconds)."
