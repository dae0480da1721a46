"""Rules next to the field (ddlkit.options): checked where OmegaConf would not (it runs no
``__post_init__``), on composed configs and on schema instances alike."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from ddlkit.errors import ConfigError
from ddlkit.options import POSITIVE, POSITIVE_INTEGER, at_least, check, checked


@dataclass
class Inner:
    size: int | None = checked(None, at_least(1, "null or a positive integer"))


@dataclass
class Outer:
    nodes: int = checked(1, POSITIVE_INTEGER)
    pace_s: float = checked(5.0, POSITIVE)
    inner: Inner = field(default_factory=Inner)


def test_a_value_given_after_composing_is_checked() -> None:
    merged = OmegaConf.merge(OmegaConf.structured(Outer), {"nodes": 0})
    with pytest.raises(ConfigError) as info:
        check(OmegaConf.create({"compute": merged}))
    assert str(info.value) == "compute.nodes=0 is invalid: it must be a positive integer."


def test_nested_nodes_are_named_by_their_path() -> None:
    with pytest.raises(ConfigError) as info:
        check(OmegaConf.merge(OmegaConf.structured(Outer), {"inner": {"size": 0}}), "compute")
    assert str(info.value) == "compute.inner.size=0 is invalid: it must be null or a positive integer."


def test_a_schema_instance_is_checked_as_its_config_is() -> None:
    with pytest.raises(ConfigError, match=r"^compute\.pace_s=0 is invalid: it must be positive\.$"):
        check(Outer(pace_s=0), "compute")
    with pytest.raises(ConfigError, match=r"^compute\.inner\.size=-1 is invalid"):
        check(Outer(inner=Inner(size=-1)), "compute")


def test_defaults_and_nulls_pass() -> None:
    check(OmegaConf.structured(Outer), "compute")
    check(Outer(inner=Inner(size=None)), "compute")
    check({"not": "a schema"}, "compute")
