"""The plugin's tests use ddlkit's test kit, as any plugin's would, and a real Ray cluster of two
simulated nodes on this machine (:class:`ddlkit_ray.testing.LocalRayCluster`: ``ray start`` on
loopback, one CPU per node), started once per session and stopped at its end. Without Ray on
this machine the tests that need it skip, saying what to install."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

pytest_plugins = ["ddlkit.testing"]

if importlib.util.find_spec("ray") is not None:
    # Ray sets RAY_CLIENT_MODE in the environment when first imported (by compute=ray, in a test):
    # imported here, before any test's environment snapshot, it is part of the environment to restore
    import ray.job_submission  # noqa: F401 -- imported for what importing it does


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Environment restored, a working directory of its own, fresh plugin and Hydra state."""


def needs_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install 'ray[default]'")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A running Ray cluster of two nodes (the head and a worker), one CPU each; with
    ``DDLKIT_TEST_RAY_CLUSTER=http://...`` set, that cluster's Jobs endpoint instead (started by the
    caller with the ranks' environment: ddlkit importable, DDLKIT_PLUGINS=ddlkit.testing.fakes)."""
    needs_ray()
    from ddlkit_ray.testing import LocalRayCluster

    if os.environ.get("DDLKIT_TEST_RAY_CLUSTER"):
        yield SimpleNamespace(address=os.environ["DDLKIT_TEST_RAY_CLUSTER"])
        return
    # the raylets' environment is this one (the ranks import ddlkit from where the tests do), with
    # the test kit's fakes registered (framework=fake)
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    cluster = LocalRayCluster(nodes=2, cpus_per_node=1, env=env)
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.skip(f"a local Ray cluster did not start: {exc}")
    yield cluster
    cluster.stop()
