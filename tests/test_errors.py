"""The error tree: who must act on each error, and the exit code the CLI gives it."""

from __future__ import annotations

import re

import pytest

import ddlkit
from ddlkit import errors
from ddlkit.errors import (
    ConfigError,
    DdlkitError,
    JobFailedError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    RunError,
    UnknownNameError,
    exit_code_for,
)


def test_the_tree() -> None:
    parents = {
        cls: cls.__bases__
        for cls in (
            ConfigError,
            UnknownNameError,
            PluginError,
            PluginLoadError,
            PluginConflictError,
            RunError,
            JobFailedError,
        )
    }
    assert parents == {
        ConfigError: (DdlkitError,),
        UnknownNameError: (ConfigError, LookupError),
        PluginError: (DdlkitError,),
        PluginLoadError: (PluginError,),
        PluginConflictError: (PluginError,),
        RunError: (DdlkitError,),
        JobFailedError: (RunError,),
    }
    assert DdlkitError.__bases__ == (Exception,)


def test_the_docstring_draws_every_error() -> None:
    drawn = re.findall(r"^\s+[*x+] (\w+)", errors.__doc__, re.M)
    classes = sorted(n for n in errors.__all__ if isinstance(getattr(errors, n), type))
    assert sorted(drawn) == classes


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (UnknownNameError("framework", "x", [], "framework"), 2),
        (ConfigError("bad"), 2),
        (PluginLoadError("bad"), 3),
        (PluginConflictError("bad"), 3),
        (RunError("bad"), 1),
        (JobFailedError("preempted", exit_code=75), 75),
        (JobFailedError("failed", exit_code=0), 1),
        (DdlkitError("bad"), 1),
        (ValueError("a bug"), 1),
    ],
)
def test_exit_codes(err: BaseException, code: int) -> None:
    assert exit_code_for(err) == code


def test_run_error_carries_component_and_step() -> None:
    err = RunError("loss is nan", component="framework", step=120)
    assert (str(err), err.component, err.step) == ("loss is nan", "framework", 120)
    failed = JobFailedError("job x failed", exit_code=4)
    assert (failed.component, failed.step, failed.exit_code) == ("compute", None, 4)


def test_unknown_name_error_sorts_choices_and_catches_as_lookup_error() -> None:
    with pytest.raises(LookupError) as info:
        raise UnknownNameError("logger", "wandb", ["jsonl", "console"], "logger")
    assert info.value.choices == ["console", "jsonl"]
    assert str(info.value) == "unknown logger 'wandb' (config key `logger`). Choose one of: console, jsonl."


def test_errors_are_public() -> None:
    for name in (
        "ConfigError",
        "DdlkitError",
        "JobFailedError",
        "PluginConflictError",
        "PluginError",
        "PluginLoadError",
        "RunError",
        "UnknownNameError",
    ):
        assert getattr(ddlkit, name) is getattr(errors, name)
