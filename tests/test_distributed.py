"""Where a rank learns its place: OpenMPI, torchrun, or a single process."""

from __future__ import annotations

import pytest

import ddlkit
from ddlkit import DistContext


def test_a_single_process_by_default() -> None:
    ctx = DistContext.from_env(env={})
    assert ctx == DistContext(0, 1, 0, 1, 0, "none")
    assert ctx.is_main and ctx.is_local_main
    assert ctx.allreduce_mean({"loss": 2.0}) == {"loss": 2.0}


def test_openmpi_variables_win_over_torchrun() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "RANK": "0", "WORLD_SIZE": "1"}
    ctx = DistContext.from_env("horovod", env)
    assert ctx == DistContext(rank=5, world_size=8, local_rank=1, local_size=4, node=1, backend="horovod")
    assert not ctx.is_main and not ctx.is_local_main


def test_torchrun_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert DistContext.from_env("native", env) == DistContext(3, 4, 1, 2, 1, "native")


def test_collectives_of_several_ranks_need_a_connection() -> None:
    with pytest.raises(ddlkit.RunError, match=r"dist\.backend=native: barrier across 2 ranks before"):
        DistContext(0, 2, backend="native").barrier()
