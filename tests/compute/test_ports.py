"""Rendezvous ports chosen where the kernel hands none to other processes meanwhile."""

from __future__ import annotations

import socket

import pytest

from ddlkit.compute import ports
from ddlkit.compute.ports import LOWEST_PORT, ephemeral_range, free_ports


def test_ports_are_consecutive_free_and_below_the_kernels_ephemeral_range() -> None:
    low, _ = ephemeral_range()
    for _ in range(20):
        first, second = free_ports(2)
        assert second == first + 1 and LOWEST_PORT <= first and second < low
        with socket.socket() as a, socket.socket() as b:  # both free: rank 0 can bind them
            a.bind(("127.0.0.1", first))
            b.bind(("127.0.0.1", second))


def test_a_port_in_use_is_never_given(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 2048, 60999))
        picks = iter([taken - 1, taken, taken + 5])  # pairs that hold the busy port come first
        monkeypatch.setattr(ports._RANDOM, "choice", lambda _candidates: next(picks))
        assert free_ports(2) == [taken + 5, taken + 6]


def test_a_seeded_random_module_does_not_make_two_launchers_pick_alike() -> None:
    import random

    picks = set()
    for _ in range(5):
        random.seed(42)  # what a job's or a test's code may do before it launches
        picks.add(free_ports(2)[0])
    assert len(picks) > 1


def test_where_every_port_is_ephemeral_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    (port,) = free_ports(1)
    assert 1024 <= port <= 65535
