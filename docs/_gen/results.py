"""reference/results.md: the fields of result.json (``ddlkit.result``) and the job directory's layout,
names, exit statuses and environment (``ddlkit.jobdir``)."""

from __future__ import annotations

import inspect

from ddlkit import jobdir, result

from .sdk import signature
from .source import assignment_order, docstring, element_comments, first_paragraph, module_comments
from .tables import cell, code, unbroken, yaml_value


def _fields() -> str:
    comments = element_comments(result, "FIELDS")
    better = {result.MAXIMIZE: "larger", result.MINIMIZE: "smaller", None: ""}
    out = ["| Field | Type | Better | Description |", "| --- | --- | --- | --- |"]
    for f, comment in zip(result.FIELDS, comments or [""] * len(result.FIELDS), strict=True):
        kind = {dict: "mapping", str: "str", int: "int", float: "float"}.get(f.type, f.type.__name__)
        out.append(f"| {unbroken(f.name)} | {kind} or null | {better[f.direction]} | {cell(comment)} |")
    return "\n".join(out) + "\n"


def _views() -> str:
    comments = module_comments(result)
    out = ["| View | Fields | What shows it |", "| --- | --- | --- |"]
    for view in assignment_order(result):
        value = getattr(result, view, None)
        if view == "FIELDS" or not (isinstance(value, tuple) and value and isinstance(value[0], result.Field)):
            continue
        out.append(f"| {unbroken(view)} | {', '.join(f'`{f.name}`' for f in value)} | {cell(comments.get(view, ''))} |")
    return "\n".join(out) + "\n"


def _constants(names: list[str]) -> str:
    comments = module_comments(jobdir)
    out = ["| Name | Value | Description |", "| --- | --- | --- |"]
    for constant in names:
        value = getattr(jobdir, constant)
        shown = value if isinstance(value, str) else yaml_value(value)
        out.append(f"| {unbroken(constant)} | {cell(code(str(shown)))} | {cell(comments.get(constant, ''))} |")
    return "\n".join(out) + "\n"


def page() -> str:
    names = [n for n in assignment_order(jobdir) if n.isupper() and not n.startswith("_")]
    exits = [n for n in names if n.startswith("EXIT_")]
    env = [n for n in names if n.endswith("_ENV")]
    files = [n for n in names if n not in exits and n not in env]
    functions = [
        n for n in assignment_order(jobdir) if inspect.isfunction(getattr(jobdir, n, None)) and not n.startswith("_")
    ]
    result_doc, jobdir_doc = docstring(result), docstring(jobdir)
    out = [
        "# result.json and the job directory",
        "",
        "Generated from `ddlkit.result` and `ddlkit.jobdir`, the one place each of these names is spelled.",
        "",
        "## result.json",
        "",
        "Rank 0 writes `result.json` into the job directory once training completed (its absence after a "
        "job ended means the job failed). Every framework writes the same fields; a field that was not "
        "measured or does not apply is null.",
        "",
        _fields(),
        "Plugins add keys of their own beside these (PyTorch: `device_name`, `loss_scale`, ...).",
        "",
        "### Views",
        "",
        "The fields each reader of a result shows, in its order:",
        "",
        _views(),
        "## The job directory",
        "",
        jobdir_doc.text if jobdir_doc else "",
        "",
        "### Names",
        "",
        _constants(files),
        "### Exit statuses",
        "",
        "Every rank's exit status, and the `ddlkit` command's:",
        "",
        _constants(exits),
        "### Environment",
        "",
        "What the launcher sets in a job's environment, beside the compute target's own:",
        "",
        _constants(env),
        "### Functions",
        "",
    ]
    for name in functions:
        function = getattr(jobdir, name)
        out.append(f"- `{name}{signature(function)}`: {first_paragraph(function.__doc__)}")
    out.append("")
    out += ["## The fields' table in code", "", result_doc.text if result_doc else "", ""]
    return "\n".join(out)
