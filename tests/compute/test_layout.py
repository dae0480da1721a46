"""The rank layout has one owner (ddlkit.compute.layout): what every target writes, the rank reads
back as its DistContext, and the control plane's port is the one after MASTER_PORT everywhere."""

from __future__ import annotations

from ddlkit import DistContext
from ddlkit.compute.layout import CONTROL_PORT_SHELL, RankLayout, control_port
from ddlkit.rank.distributed import control_address


def test_what_a_target_writes_the_rank_reads_back() -> None:
    env = RankLayout(
        rank=5, world_size=8, local_rank=1, local_size=4, node=1, master_addr="node-0", master_port=29500
    ).to_env()
    assert env == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "DDLKIT_NODE": "1",
        "DDLKIT_LOCAL_RANK": "1",
        "DDLKIT_LOCAL_SIZE": "4",
        "MASTER_ADDR": "node-0",
        "MASTER_PORT": "29500",
        "DDLKIT_CONTROL_ADDR": "node-0:29501",
    }
    dist = DistContext.from_env("native", env)
    assert (dist.rank, dist.world_size, dist.local_rank, dist.local_size, dist.node) == (5, 8, 1, 4, 1)
    assert control_address(env) == ("node-0", 29501)
    assert set(env) == set(RankLayout.variables())


def test_the_control_port_is_the_one_after_the_rendezvous_port_in_python_and_in_shell() -> None:
    import subprocess

    assert control_port(29500) == 29501
    assert control_address({"MASTER_ADDR": "h", "MASTER_PORT": "29500"}) == ("h", 29501)
    shell = subprocess.run(
        ["bash", "-c", f"MASTER_PORT=29500; echo {CONTROL_PORT_SHELL}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert shell == "29501"


def test_without_a_rendezvous_only_the_place_is_written() -> None:
    assert "MASTER_ADDR" not in RankLayout(0, 2, 0, 2, 0).to_env()
