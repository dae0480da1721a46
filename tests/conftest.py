"""ddlkit's own tests use the kit they ship to plugin authors (ddlkit.testing) first."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# pytester: tests/testing/test_kit.py runs pytest sessions that use the kit as a plugin author would
pytest_plugins = ["ddlkit.testing", "pytester"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Every test: environment restored (and leaks reported), its own working directory, a fresh
    plugin manager cache and Hydra state (see ddlkit.testing.ddlkit_isolation)."""


@pytest.fixture
def mount_tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """``mount_tmpfs(dir, size)``: a small file system of its own at ``dir`` (created), to fill up
    for real; unmounted after the test. Skips the test where mounting is not permitted (not root,
    or a container without CAP_SYS_ADMIN)."""
    mounted: list[Path] = []

    def mount(directory: Path, size: str) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs to fill up needs root")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
        mounted.append(directory)
        return directory

    yield mount
    for directory in reversed(mounted):
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)
