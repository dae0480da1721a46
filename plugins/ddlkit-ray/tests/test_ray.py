"""compute=ray on a real Ray cluster (see conftest.py): the compute contract, ``ddlkit plan``, the
one-line errors, training runs on two simulated nodes, the user's code shipped, a sweep,
detach/attach, cancel with a checkpoint, and a lost node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ddlkit
from ddlkit import JobSpec
from ddlkit.testing import RunFactory
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit_ray.target import RayConfig, RayTarget


def ray_target(address: str, **options: object) -> RayTarget:
    return RayTarget(RayConfig(**{"address": address, "poll_interval_s": 0.3, "grace_period_s": 10.0,
                                  "placement_timeout_s": 60.0, **options}))


def one_line_error(outcome, *fragments: str) -> str:
    outcome.assert_returncode(2)
    lines = [ln for ln in outcome.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, outcome.output
    assert "Traceback" not in outcome.stderr
    for fragment in fragments:
        assert fragment in lines[0], outcome.output
    return lines[0]


# ---------------------------------------------------------------------------- the contract
@pytest.mark.slow
class TestRayContract(ComputeTargetContract):
    # a Ray job: the working_dir uploaded, the runtime environment set up, the driver and an actor started
    timeout_s = 120.0
    cancel_timeout_s = 60.0

    @pytest.fixture
    def target(self, ray_cluster) -> RayTarget:
        return ray_target(ray_cluster.address)
