"""Option tables from dataclass schemas: key, type, default, constraint and the field's comment."""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ddlkit.options import RULE

from .source import field_comment


@dataclass(frozen=True)
class Option:
    """One row of an option table."""

    #: the key as typed on the command line (``compute.nodes``, ``logger.wandb.project``)
    key: str
    #: the anchor of its row in reference/options.md
    anchor: str
    type: str
    default: str
    constraint: str
    description: str


def type_name(tp: Any) -> str:
    """A field's type as a user of YAML and the command line reads it: ``int or null``, ``list of str``,
    ``str`` for an enum (its choices are the constraint)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, tuple, Sequence):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (dict, typing.Mapping) or tp is dict:
        return "mapping"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "str"
    if tp is Any:
        return "any"
    if dataclasses.is_dataclass(tp):
        return "options"
    return getattr(tp, "__name__", str(tp))


def yaml_value(value: Any) -> str:
    """A default as it reads in YAML / on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, str):
        return value if value and value.strip() == value and value not in ("null", "true", "false") else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _enum_of(tp: Any) -> type[enum.Enum] | None:
    for candidate in (tp, *typing.get_args(tp)):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def options(
    schema: type, prefix: str, anchor: str, *, only: dict[str, str] | None = None, skip: Sequence[str] = ("name",)
) -> Iterator[Option]:
    """The rows of ``schema``'s table: each field, and each field of a nested schema below its own row.
    ``prefix``: the keys' prefix (``compute``); ``anchor``: the section's anchor (``compute-slurm``);
    ``only``: per field, a note that only some implementations have it."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name in skip or not f.init:
            continue
        tp = hints.get(f.name, f.type)
        default = _default(f)
        rule = f.metadata.get(RULE)
        choices = _enum_of(tp)
        constraint = (
            rule.requirement
            if rule is not None
            else ("one of: " + ", ".join(str(m.value) for m in choices) if choices else "")
        )
        description = field_comment(schema, f.name)
        if only and f.name in only:
            description = f"{description} ({only[f.name]})" if description else only[f.name]
        nested = tp if dataclasses.is_dataclass(tp) else None
        shown = (
            "required"
            if default is dataclasses.MISSING or default == "???"
            else ("" if nested else yaml_value(default))
        )
        key, row_anchor = f"{prefix}.{f.name}", f"{anchor}.{f.name}"
        yield Option(key, row_anchor, type_name(tp), shown, constraint, description)
        if nested is not None:
            yield from options(nested, key, row_anchor, skip=())


def cell(text: str) -> str:
    """Text for a table cell: pipes escaped, HTML's ``<`` kept as text outside code spans."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts).replace("|", "\\|")


def code(text: str) -> str:
    return f"`{text}`" if text else ""


def unbroken(text: str) -> str:
    """A name in a table's first column, never broken across lines (the theme breaks code anywhere, and a
    table gives its first column the least room); ``text`` is a plain identifier or dotted key."""
    return f'<code style="white-space: nowrap">{text}</code>'


def table(rows: Sequence[Option], *, link: str | None = None) -> str:
    """A Markdown table of ``rows``: the key, its default, and its comment with its type and rule below it
    (three columns: the keys stay whole and the words get the room). Each key carries its anchor (``link``
    None: the reference page), or links to it on ``link`` (a how-to page)."""
    if not rows:
        return "This option has no settings of its own.\n"
    out = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for o in rows:
        key = unbroken(o.key)
        key = f'<a id="{o.anchor}"></a>{key}' if link is None else f"[{key}]({link}#{o.anchor})"
        facts = o.type + (f"; must be {o.constraint}" if o.constraint else "")
        description = f"{cell(o.description)}<br>*{cell(facts)}*" if o.description else f"*{cell(facts)}*"
        out.append(f"| {key} | {cell(code(o.default))} | {description} |")
    return "\n".join(out) + "\n"
