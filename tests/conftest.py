"""ddlkit's own tests use the kit they ship to plugin authors (ddlkit.testing) first."""

from __future__ import annotations

import pytest

# pytester: tests/testing/test_kit.py runs pytest sessions that use the kit as a plugin author would
pytest_plugins = ["ddlkit.testing", "pytester"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Every test: environment restored (and leaks reported), its own working directory, a fresh
    plugin manager cache and Hydra state (see ddlkit.testing.ddlkit_isolation)."""
