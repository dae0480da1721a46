"""The plugin's tests use ddlkit's test kit, as any plugin's would."""

from __future__ import annotations

import pytest

pytest_plugins = ["ddlkit.testing"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Environment restored, a working directory of its own, fresh plugin and Hydra state."""


@pytest.fixture(scope="session")
def event_accumulator() -> type:
    """TensorBoard's reader of event files. It loads TensorFlow when installed, which sets environment
    variables as it imports: loaded once per session, before any test's environment is recorded."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat import tf

    tf.__version__  # noqa: B018 - resolves the lazy module now
    return EventAccumulator
