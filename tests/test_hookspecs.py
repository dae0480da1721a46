"""The hook specifications are the plugin API's reference: named, typed and documented."""

from __future__ import annotations

import inspect

import pytest

from ddlkit import hookspecs
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.registry import HOOK_POINTS

SPECS = {name: fn for name, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, "ddlkit_spec")}
REGISTRATION = {hp.hook for hp in HOOK_POINTS.values()}


def test_the_hooks() -> None:
    assert sorted(SPECS) == sorted(
        [
            *REGISTRATION,
            "ddlkit_configure",
            "ddlkit_job_environment",
            "ddlkit_run_loop",
            "ddlkit_run_start",
            "ddlkit_step_end",
            "ddlkit_epoch_end",
            "ddlkit_checkpoint_saved",
            "ddlkit_run_end",
        ]
    )


def test_a_manager_knows_every_spec(ddlkit_pm: DdlkitPluginManager) -> None:
    for name in SPECS:
        assert getattr(ddlkit_pm.hook, name).spec is not None, name


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_is_prefixed_typed_and_documented(name: str) -> None:
    fn = SPECS[name]
    assert name.startswith("ddlkit_")
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty, f"{name} has no return annotation"
    for param in sig.parameters.values():
        assert param.annotation is not inspect.Parameter.empty, f"{name}({param.name}) is not annotated"
    doc = inspect.getdoc(fn) or ""
    assert doc, f"{name} has no docstring"
    assert ".. versionadded::" in doc
    if name in REGISTRATION:
        assert "Example::" in doc and "ddlkit.Registration(" in doc, f"{name} shows no pasteable example"
    for documented in (line.split()[1].rstrip(":") for line in doc.splitlines() if line.startswith(":param ")):
        assert documented in sig.parameters, f"{name} documents :param {documented}: that it does not take"


def test_only_the_run_loop_stops_at_the_first_result() -> None:
    first = {name for name, fn in SPECS.items() if fn.ddlkit_spec.get("firstresult")}
    assert first == {"ddlkit_run_loop"}
    assert not any(fn.ddlkit_spec.get("historic") for fn in SPECS.values())
