"""The plugin's tests use ddlkit's test kit, as any plugin's would."""

from __future__ import annotations

import pytest

pytest_plugins = ["ddlkit.testing"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Environment restored, a working directory of its own, fresh plugin and Hydra state."""
