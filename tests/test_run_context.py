"""The run's contract: ``ddlkit.RunContext`` (with ``DistView`` and ``Schedule``) is what plugins are
typed against, the rank's ``Run`` implements every member of it, and the shared base no longer
reaches into the rank wing for it."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

import ddlkit
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.testing import make_run

PACKAGE = Path(ddlkit.__file__).parent


def members(protocol: type) -> dict[str, object]:
    """The members ``protocol`` declares (its own and its protocol bases'): annotated attributes
    (as None), methods and properties."""
    found: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if Protocol not in klass.__bases__:  # PEP 544: a protocol names Protocol among its bases
            continue
        found.update(dict.fromkeys(vars(klass).get("__annotations__", {})))
        for name, value in vars(klass).items():
            public = not name.startswith("_") or name == "__call__"
            if public and (inspect.isfunction(value) or isinstance(value, property)):
                found[name] = value
    return found


def parameters(function: Callable[..., object]) -> list[tuple[str, object]]:
    """Names and kinds of ``function``'s parameters after ``self``: what a caller relies on."""
    return [(p.name, p.kind) for p in list(inspect.signature(function).parameters.values())[1:]]


@pytest.fixture
def run(ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> ddlkit.Run:
    return make_run(ddlkit_pm, tmp_path / "job")


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [
        (ddlkit.RunContext, lambda run: run),
        (ddlkit.DistView, lambda run: run.dist),
        (ddlkit.Schedule, lambda run: run.schedule),
    ],
    ids=["RunContext", "DistView", "Schedule"],
)
def test_the_run_implements_every_member_of_the_protocol(run, protocol, implementation) -> None:
    obj = implementation(run)
    declared = members(protocol)
    assert declared, f"{protocol.__name__} declares no members"
    missing = sorted(name for name in declared if not hasattr(obj, name))
    assert not missing, f"{type(obj).__name__} lacks {protocol.__name__} members: {', '.join(missing)}"
    for name, spec in declared.items():
        if inspect.isfunction(spec):
            assert parameters(spec) == parameters(getattr(type(obj), name)), (
                f"{type(obj).__name__}.{name} takes other parameters than {protocol.__name__}.{name}"
            )


def test_every_method_of_the_protocols_is_documented() -> None:
    for protocol in (ddlkit.RunContext, ddlkit.DistView, ddlkit.Schedule):
        for name, spec in members(protocol).items():
            if spec is not None:
                doc = (spec.fget if isinstance(spec, property) else spec).__doc__
                assert doc and doc.strip(), f"{protocol.__name__}.{name} has no docstring"


def imports_of(source: str, package: str) -> set[str]:
    """Every module that ``source``, a module of ``package``, imports anywhere (under
    TYPE_CHECKING and inside functions too), made absolute, with each imported name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def base_modules() -> list[Path]:
    """The shared base: ``ddlkit/*.py`` but the facade (which re-exports ``Run``) and ``python -m
    ddlkit`` (the launcher's CLI), and the interfaces."""
    base = [p for p in sorted(PACKAGE.glob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
    return base + sorted(PACKAGE.glob("interfaces/*.py"))


@pytest.mark.parametrize("path", base_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_base_imports_nothing_from_the_rank_wing(path: Path) -> None:
    package = ".".join(path.relative_to(PACKAGE.parent).parent.parts)
    wing = sorted(
        m
        for m in imports_of(path.read_text(encoding="utf-8"), package)
        if m == "ddlkit.rank" or m.startswith("ddlkit.rank.")
    )
    assert not wing, f"{path.relative_to(PACKAGE.parent)} imports {', '.join(wing)}"


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..rank.run import Run\n", "ddlkit.interfaces"),
        ("def f():\n    from .rank import run\n", "ddlkit"),
        ("import ddlkit.rank.worker\n", "ddlkit"),
    ],
)
def test_the_import_check_sees_every_form_of_import(source: str, package: str) -> None:
    """The check above must not pass for want of seeing an import: the form the interfaces used
    (relative, under TYPE_CHECKING), a lazy one and an absolute one."""
    assert any(m.startswith("ddlkit.rank") for m in imports_of(source, package))


def wing_modules(wing: str) -> list[Path]:
    return sorted((PACKAGE / wing).rglob("*.py"))


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).parent.parts)


@pytest.mark.parametrize(("wing", "other"), [("launch", "rank"), ("rank", "launch")])
def test_neither_wing_imports_the_other(wing: str, other: str) -> None:
    """The launcher (CLI, validation, the job directory's writing, jobs, sweeps) and the rank (worker,
    Run, checkpoints, control plane) share only the base: a rank never loads the launcher's code,
    and the launcher never runs a rank's."""
    crossing = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            m
            for m in imports_of(path.read_text(encoding="utf-8"), package_of(path))
            if m == f"ddlkit.{other}" or m.startswith(f"ddlkit.{other}.")
        )
        for path in wing_modules(wing)
    }
    assert len(crossing) > 5 and {k: v for k, v in crossing.items() if v} == {}


@pytest.mark.parametrize("path", base_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_base_imports_nothing_from_the_launch_wing(path: Path) -> None:
    wing = sorted(
        m
        for m in imports_of(path.read_text(encoding="utf-8"), package_of(path))
        if m == "ddlkit.launch" or m.startswith("ddlkit.launch.")
    )
    assert not wing, f"{path.relative_to(PACKAGE.parent)} imports {', '.join(wing)}"
