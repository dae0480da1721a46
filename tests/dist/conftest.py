"""Multi-rank jobs for the distributed tests (:mod:`ddlkit.testing.multirank`), with this
directory's plugin modules (``busy_rank``) importable in launcher and ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ddlkit.testing import multirank

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests here run jobs on compute=local_mpi: they need ddlkit-mpi and OpenMPI's mpirun."""
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.plugins)
            item.add_marker(pytest.mark.extras)


@pytest.fixture(scope="session")
def dt() -> SimpleNamespace:
    """The helpers of :mod:`ddlkit.testing.multirank`, jobs importing this directory's plugins."""
    return SimpleNamespace(
        DistJobs=lambda base: multirank.DistJobs(base, path=[HERE]),
        worker_pids=multirank.worker_pids,
        job_processes=multirank.job_processes,
        read_lines_until=multirank.read_lines_until,
        load_weights=multirank.load_weights,
    )
