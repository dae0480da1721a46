"""reference/sdk.md: the plugin SDK -- the hooks, the public facade ``ddlkit`` and the public modules a
plugin imports, each with its docstring and its public names (signature, first paragraph)."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import typing
from types import ModuleType
from typing import Any

import ddlkit

from .source import docstring, first_paragraph, markdown, module_comments
from .tables import cell, code, type_name, unbroken, yaml_value

#: the facade's docstring names the public modules beside it (``:mod:`ddlkit.optim```); the test kit
#: (``ddlkit.testing``) names its own, and with them these are what tests/test_public_api.py holds public
KIT = "ddlkit.testing"
_MOD = re.compile(r":mod:`~?(ddlkit(?:\.\w+)+)`")


def public_modules() -> list[str]:
    """The modules a plugin imports: ``ddlkit``, the modules its docstring names as public, the test kit
    and the modules of it that its docstring names and that declare ``__all__``."""
    named = list(dict.fromkeys(_MOD.findall(ddlkit.__doc__ or "")))
    kit = importlib.import_module(KIT)
    kit_named = [
        m for m in dict.fromkeys(_MOD.findall(kit.__doc__ or "")) if hasattr(importlib.import_module(m), "__all__")
    ]
    return ["ddlkit", *named, KIT, *kit_named]


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def signature(obj: Any) -> str:
    """``(a: int, *, b: str = 'x') -> None``, string annotations shown as written."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    parts = []
    star_done = False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        text = prefix + p.name
        if ann := _annotation(p.annotation):
            text += f": {ann}"
        if p.default is not p.empty:
            text += (" = " if ann else "=") + repr(p.default)
        parts.append(text)
    ret = "" if inspect.isclass(obj) else _annotation(sig.return_annotation)
    return f"({', '.join(parts)})" + (f" -> {ret}" if ret else "")


def _kind(obj: Any) -> str:
    if hasattr(obj, "_get_wrapped_function"):
        return "pytest fixture"
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        if issubclass(obj, enum.Enum):
            return "enum"
        if dataclasses.is_dataclass(obj):
            return "dataclass"
        if getattr(obj, "_is_protocol", False):
            return "protocol"
        if inspect.isabstract(obj):
            return "abstract class"
        return "class"
    if inspect.isfunction(obj):
        return "function"
    return "constant"


def _own_doc(obj: Any) -> str | None:
    """The object's own docstring: not one a class inherits from ``object`` or a library base."""
    doc = (
        obj.__doc__
        if inspect.isclass(obj) and "__doc__" in obj.__dict__
        else (inspect.getdoc(obj) if not inspect.isclass(obj) else None)
    )
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return None  # the signature dataclasses write as a docstring
    return doc


def _members(cls: type) -> list[str]:
    out = []
    for name, member in cls.__dict__.items():
        if name.startswith("_"):
            continue
        target = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if isinstance(member, property):
            out.append(f"- `{name}` (property): {first_paragraph(member.fget.__doc__ if member.fget else None)}")
        elif inspect.isfunction(target):
            out.append(f"- `{name}{signature(target)}`: {first_paragraph(target.__doc__)}")
    return out


def _fields(cls: type) -> str:
    from .source import field_comment

    hints: dict[str, Any] = {}
    try:
        import typing

        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation only a type checker resolves: show it as written
        pass
    rows = ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else None
        )
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        shown = "required" if required else yaml_value(default) if not callable(default) else repr(default)
        rows.append(
            f"| {unbroken(f.name)} | {cell(type_name(tp) if not isinstance(tp, str) else tp)} | "
            f"{cell(code(shown))} | {cell(field_comment(cls, f.name))} |"
        )
    return "\n".join(rows) + "\n"


def _name_section(qualified: str, obj: Any, comment: str, level: str = "###") -> list[str]:
    kind = _kind(obj)
    out = [f"{level} {qualified}", ""]
    if kind == "pytest fixture":
        function = obj._get_wrapped_function()
        text = first_paragraph(function.__doc__)
        return out + [f"*pytest fixture* `{obj.name}`" + (f": {text}" if text else ""), ""]
    if kind == "constant":
        value = (
            obj
            if isinstance(obj, str)
            else yaml_value(obj)
            if isinstance(obj, (tuple, list, dict, int, float))
            else type(obj).__name__
        )
        out += [f"*constant* `{value}`" + (f": {markdown(comment)}" if comment else ""), ""]
        return out
    sig = signature(obj) if kind not in ("enum", "protocol", "abstract class") or inspect.isfunction(obj) else ""
    out += [f"*{kind}*", ""]
    if sig and kind != "exception":
        out += ["```python", f"{'class ' if inspect.isclass(obj) else 'def '}{obj.__name__}{sig}", "```", ""]
    text = first_paragraph(_own_doc(obj)) or markdown(comment)
    if text:
        out += [text, ""]
    if inspect.isclass(obj):
        if kind == "enum":
            out += ["Members: " + ", ".join(f"`{m.name}`" for m in obj), ""]
        elif dataclasses.is_dataclass(obj):
            out += [_fields(obj)]
        members = _members(obj)
        if members:
            out += [*members, ""]
    return out


def _comment(name: str, obj: Any, home: ModuleType) -> str:
    """The comment above ``name``'s assignment: in ``home``, or in the ddlkit module it was imported from."""
    import sys

    for module in [home, *(m for n, m in sorted(sys.modules.items()) if n.startswith("ddlkit") and m is not home)]:
        if getattr(module, name, None) is obj and (text := module_comments(module).get(name)):
            return text
    return ""


def _public_names(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and getattr(v, "__module__", None) == module.__name__
        and (inspect.isclass(v) or inspect.isfunction(v))
    ]


def _hooks() -> list[str]:
    from ddlkit import hookspecs

    out = ["## Hooks", "", docstring(hookspecs).text if docstring(hookspecs) else "", ""]
    for name, function in vars(hookspecs).items():
        if inspect.isfunction(function) and name.startswith("ddlkit_"):
            doc = inspect.getdoc(function) or ""
            out += [f"### {name}", "", "```python", f"def {name}{signature(function)}", "```", "", markdown(doc), ""]
    return out


def page() -> str:
    exports: dict[str, str] = getattr(ddlkit, "_EXPORTS", {})
    modules = public_modules()
    out = [
        "# Plugin SDK",
        "",
        "What a plugin may import: the hooks it implements, the facade `ddlkit` and the public modules "
        f"beside it ({', '.join(f'`{m}`' for m in modules[1:])}). Everything else in ddlkit is internal "
        "and may change. Generated from the modules' docstrings and signatures.",
        "",
    ]
    out += _hooks()
    for module_name in modules:
        module = importlib.import_module(module_name)
        doc = docstring(module)
        out += [f"## {module_name}", "", doc.text if doc else "", ""]
        for name in _public_names(module):
            obj = getattr(module, name)
            home = importlib.import_module(exports[name], "ddlkit") if module is ddlkit and name in exports else module
            out += _name_section(f"{module_name}.{name}", obj, _comment(name, obj, home))
    return "\n".join(out)
