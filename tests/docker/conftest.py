"""What the tests of ddlkit's images share: where the recipe is and the defaults of its build arguments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"


@pytest.fixture(scope="session")
def dockerfile_args() -> dict[str, str]:
    """docker/Dockerfile's build arguments and their defaults (``""`` for none), e.g. TORCH_VERSION."""
    return {
        name: value.strip('"')
        for name, value in re.findall(r"^ARG (\w+)(?:=(.*))?$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    }
