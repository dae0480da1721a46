"""Hydra's own launcher conformance suites, run against ``hydra/launcher=ddlkit`` (as Hydra's
launcher plugins run them): plain Hydra apps, each job forked from the launcher."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.version import VersionBase
from packaging.version import Version

from hydra_plugins.ddlkit_launcher.ddlkit_launcher import DdlkitLauncher


@pytest.fixture(autouse=True)
def _hydra_version_base_as_in_a_fresh_process() -> Iterator[None]:
    """The suites expect what a fresh process assumes when no app chose a version_base: 1.1 (jobs
    change directory). ddlkit's own tests leave 1.3 chosen in Hydra's process-wide state."""
    saved = VersionBase.instance().getbase()
    VersionBase.instance().setbase(Version("1.1"))
    yield
    VersionBase.instance().version_base = saved


def test_hydra_discovers_the_launcher() -> None:
    # Hydra executes plugin modules itself (not through the import system): compare by name
    found = {f"{cls.__module__}.{cls.__qualname__}" for cls in Plugins.instance().discover(Launcher)}
    assert f"{DdlkitLauncher.__module__}.{DdlkitLauncher.__qualname__}" in found


@pytest.mark.parametrize(
    "launcher_name, overrides",
    [
        ("ddlkit", []),
        ("ddlkit", ["hydra.launcher.max_parallel=1"]),
    ],
)
class TestDdlkitLauncher(LauncherTestSuite):
    pass


# each test runs a generated Hydra app in a subprocess
@pytest.mark.slow
@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=ddlkit"])])
class TestDdlkitLauncherIntegration(IntegrationTestSuite):
    pass
