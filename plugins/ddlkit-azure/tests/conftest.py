"""The plugin's suite uses ddlkit's test kit and its own Azurite fixtures, as a third party would."""

from __future__ import annotations

import pytest

pytest_plugins = ["ddlkit.testing", "ddlkit_azure.testing"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Environment restored, own working directory, fresh plugin manager (ddlkit.testing)."""
