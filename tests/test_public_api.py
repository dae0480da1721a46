"""The public facade: ``ddlkit.__all__`` is sorted, complete and leaks nothing private."""

from __future__ import annotations

import importlib

import pytest

import ddlkit
import ddlkit.interfaces


def isort_style(names: list[str]) -> list[str]:
    """Constants, then classes, then functions, each alphabetical (ruff's RUF022 order)."""
    return sorted(set(names), key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))


def test_all_is_sorted_and_unique() -> None:
    assert ddlkit.__all__ == isort_style(ddlkit.__all__)


def test_every_name_in_all_is_importable_and_public() -> None:
    for name in ddlkit.__all__:
        assert not name.startswith("_"), name
        assert getattr(ddlkit, name) is not None, name


def test_all_is_complete() -> None:
    """The facade's names (``dir``, loaded or not) are __all__, and so are the names type checkers
    are told of (its ``if TYPE_CHECKING:`` imports): the lazy table and the typed one agree."""
    import ast
    import inspect

    public = {n for n in dir(ddlkit) if not n.startswith("_")}
    assert public == set(ddlkit.__all__)
    tree = ast.parse(inspect.getsource(ddlkit))
    typed = {
        alias.name
        for node in tree.body
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for imp in node.body
        if isinstance(imp, ast.ImportFrom)
        for alias in imp.names
    }
    assert typed == set(ddlkit.__all__)


def test_names_load_when_first_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ddlkit; before = 'ddlkit.rank.run' in sys.modules; run = ddlkit.Run; "
        "print(before, run.__module__, 'ddlkit.rank.run' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "ddlkit.rank.run", "True"]


def test_every_interface_and_error_is_exported() -> None:
    from ddlkit import errors

    expected = set(ddlkit.interfaces.__all__)
    expected |= {n for n in errors.__all__ if isinstance(getattr(errors, n), type)}
    expected |= {"Registration", "Run", "RunState", "hookimpl", "hookspec", "LRSchedule", "DistContext"}
    assert expected == set(ddlkit.__all__)


def test_version_matches_the_distribution() -> None:
    from importlib.metadata import version

    assert ddlkit.__version__ == version("ddlkit")


@pytest.mark.parametrize("module", ["ddlkit.interfaces", "ddlkit.errors", "ddlkit.testing", "ddlkit.testing.contracts"])
def test_submodule_all_is_sorted_and_importable(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__ == isort_style(mod.__all__)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_importing_ddlkit_is_cheap() -> None:
    import subprocess
    import sys

    heavy = ("hydra", "torch", "tensorflow", "rich", "numpy")
    code = f"import sys, ddlkit; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
