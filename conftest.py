"""The repository's two test tiers (pyproject.toml's [tool.pytest.ini_options] says what each marker needs).

* ``pip install -e .[test] && python -m pytest`` -- no paths named: the core's fast tests on its fakes, tests/
  without those marked ``slow``, ``plugins`` or ``extras``. Needs nothing but the core and its test extra.
* ``pip install -r requirements-test.txt && python -m pytest tests plugins/*/tests`` -- the full suite, what CI
  runs (.ci/run also installs the system's part: OpenMPI, Slurm, Horovod, podman ...): the core's tests and every
  first-party plugin's suite, slow ones included, the longest suites first.

Paths or node ids named on the command line run what they hold, as asked, whatever its markers; ``-m EXPR``
replaces the core tier's selection. Each plugin's suite also runs alone from its own directory.

(The core tier cannot be an option that leaves the plugins' suites out of a list of them all: pytest imports
the conftest.py of every path it starts from before any option is read, and a plugin's conftest imports that
plugin.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

#: what ``python -m pytest`` alone selects in tests/ (pyproject.toml's testpaths)
CORE_TIER = "not slow and not plugins and not extras"

#: the order of the full suite's parts, longest first: two workers take one test file at a time each
#: (pyproject.toml's addopts), so the longest suites and files (minutes each) start first and the short
#: ones fill in at the end, where a long file picked up last would leave the other worker idle
LONGEST_FIRST = (
    "plugins/ddlkit-ray",
    "plugins/ddlkit-slurm",
    "plugins/ddlkit-pytorch/tests/test_fsdp.py",
    "tests/docker/test_images.py",
    "plugins/ddlkit-azure",
    "tests",
    "plugins/ddlkit-pytorch",
    "plugins/ddlkit-tensorflow",
    "plugins/ddlkit-keras",
    "plugins/ddlkit-wandb",
    "plugins/ddlkit-tensorboard",
    "plugins/ddlkit-mpi",
)


def _core_tier(config: pytest.Config) -> bool:
    """True for a run that names no paths, started at the repository's root (pytest then takes testpaths)."""
    return config.args_source is pytest.Config.ArgsSource.TESTPATHS


def pytest_configure(config: pytest.Config) -> None:
    if _core_tier(config) and not config.option.markexpr:
        config.option.markexpr = CORE_TIER


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _core_tier(config):
        return None
    return f"core tier: tests/ -m '{config.option.markexpr}' (the full suite: python -m pytest tests plugins/*/tests)"


def _rank(item: pytest.Item) -> int:
    try:
        where = item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return len(LONGEST_FIRST)
    return next(
        (i for i, part in enumerate(LONGEST_FIRST) if where == part or where.startswith(f"{part}/")), len(LONGEST_FIRST)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The parts named on the command line in LONGEST_FIRST's order (a stable sort: each part's own order kept)."""
    items.sort(key=_rank)
