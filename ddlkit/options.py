"""Constraints on config options, declared next to the field they constrain.

A schema says what a field's value must be with :func:`checked`, and one validator,
:func:`check`, reads every such rule of a config: the launcher checks the whole composed config
with it before anything runs, and :class:`ddlkit.ComputeTarget` checks its own options with it
when it is built (targets are also built outside a run: ``ddlkit jobs``, ``ddlkit compute down``)::

    from ddlkit.options import POSITIVE, POSITIVE_INTEGER, checked

    @dataclass
    class MyClusterConfig:
        nodes: int = checked(1, POSITIVE_INTEGER)
        poll_interval_s: float = checked(5.0, POSITIVE)

``compute.nodes=0`` then fails with ``compute.nodes=0 is invalid: it must be a positive
integer.`` (a ConfigError: one line, exit status 2). A rule sees one value; a check that needs
other options belongs in the component's ``configure(config)``.

The rules are field metadata read by :func:`check`, not a dataclass ``__post_init__``: OmegaConf
builds and merges structured configs without calling it, so a ``__post_init__`` would check the
defaults only, never the values a user gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from .errors import ConfigError

__all__ = [
    "IN_0_1",
    "MASTER_PORT",
    "NON_NEGATIVE",
    "POSITIVE",
    "POSITIVE_INTEGER",
    "Rule",
    "at_least",
    "check",
    "checked",
    "one_of",
]

#: the metadata key of a field's rule
RULE = "ddlkit.rule"


@dataclass(frozen=True)
class Rule:
    """What a field's value must be: ``ok(value)``, or the error says it must be ``requirement``.
    A null passes every rule: whether a field may be null is its type's to say (OmegaConf checks it)."""

    ok: Callable[[Any], bool]
    #: completes "<key>=<value> is invalid: it must be ..."
    requirement: str


def at_least(low: float, requirement: str | None = None) -> Rule:
    return Rule(lambda v: v >= low, requirement or f">= {low}")


def one_of(choices: Sequence[str]) -> Rule:
    return Rule(lambda v: v in choices, f"one of: {', '.join(choices)}")


POSITIVE_INTEGER = at_least(1, "a positive integer")
NON_NEGATIVE = at_least(0)
POSITIVE = Rule(lambda v: v > 0, "positive")
#: a fraction below one: momentum, Adam's betas, label smoothing
IN_0_1 = Rule(lambda v: 0 <= v < 1, "in [0, 1)")
#: rank 0's rendezvous port (``compute.master_port``): ddlkit's control plane listens on the next one
MASTER_PORT = Rule(lambda v: 1 <= v <= 65534, "a port in [1, 65534] (the control plane uses the next one)")


def checked(default: Any, rule: Rule) -> Any:
    """A dataclass field with ``default`` whose value must satisfy ``rule``."""
    return dataclasses.field(default=default, metadata={RULE: rule})


def check(node: Any, where: str = "") -> None:
    """Raise ConfigError for the first value in ``node`` that breaks its field's rule, nested nodes
    included. ``node``: a config (a DictConfig, typed or not) or a schema's dataclass instance;
    ``where``: its key in the run's config (``compute``), which the message names."""
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else type(node)
    if dataclasses.is_dataclass(schema):
        for f in dataclasses.fields(schema):
            rule = f.metadata.get(RULE)
            if rule is None or isinstance(node, DictConfig) and OmegaConf.is_missing(node, f.name):
                continue
            value = getattr(node, f.name)
            if value is not None and value != MISSING and not rule.ok(value):
                raise ConfigError(f"{_key(where, f.name)}={value} is invalid: it must be {rule.requirement}.")
    for key, child in _children(node):
        check(child, _key(where, key))


def _key(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _children(node: Any) -> Iterator[tuple[object, Any]]:
    if isinstance(node, DictConfig):
        for key, value in node.items_ex(resolve=False):
            if isinstance(value, DictConfig) and not value._is_none() and not value._is_missing():
                yield key, value
    elif dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                yield f.name, value
