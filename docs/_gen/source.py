"""What the generated pages read from the source itself: the ``#`` comments above a dataclass field
or a module constant, and docstrings as Markdown (with the line of the file each line came from,
so that a check of a generated page names the line to fix)."""

from __future__ import annotations

import ast
import functools
import inspect
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: the repository's root: paths in messages and test ids are relative to it
ROOT = Path(__file__).resolve().parents[2]


def relative(path: str | Path) -> str:
    """``path`` relative to the repository when it is inside it (for messages and test ids)."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Doc:
    """A docstring as Markdown, and where its first line is."""

    text: str
    path: str
    #: the file's line (1-based) of the text's first line
    line: int


@functools.cache
def _parsed(path: str) -> tuple[ast.Module, dict[int, str], list[str]]:
    """A source file's syntax tree, its comments by line (only the lines that hold nothing else),
    and its lines."""
    text = Path(path).read_text(encoding="utf-8")
    comments: dict[int, str] = {}
    trailing: dict[int, str] = {}
    lines = text.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            if lines[row - 1][:col].strip():
                trailing[row] = tok.string
            else:
                comments[row] = tok.string
    tree = ast.parse(text)
    tree._ddlkit_trailing = trailing  # type: ignore[attr-defined]
    return tree, comments, lines


def _comment_text(lines: list[str]) -> str:
    """``#`` / ``#:`` comment lines as one paragraph."""
    words = [re.sub(r"^#:?\s?", "", line.strip()) for line in lines]
    return " ".join(w.strip() for w in words if w.strip())


def comment_above(path: str, line: int) -> str:
    """The comment lines directly above ``line`` of ``path`` (no blank line between), and a comment
    at the end of the line itself, as one paragraph; "" when there is none."""
    tree, comments, _ = _parsed(path)
    above: list[str] = []
    row = line - 1
    while row in comments:
        above.insert(0, comments[row])
        row -= 1
    trailing = tree._ddlkit_trailing.get(line)  # type: ignore[attr-defined]
    return _comment_text(above + ([trailing] if trailing else []))


def source_file(obj: object) -> str | None:
    try:
        path = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return None
    return path if path and Path(path).is_file() else None


def _class_node(cls: type) -> tuple[str, ast.ClassDef] | None:
    path = source_file(cls)
    if path is None:
        return None
    tree, _, _ = _parsed(path)
    try:
        _, first = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ClassDef)
            and node.name == cls.__name__
            and (node.lineno == first or any(d.lineno == first for d in node.decorator_list))
        ):
            return path, node
    return None


def field_comment(cls: type, name: str) -> str:
    """The comment of field ``name`` where ``cls`` or the nearest base that comments it declares it:
    a subclass that only changes a field's default keeps its base's words."""
    for klass in cls.__mro__:
        if name not in klass.__dict__.get("__annotations__", {}):
            continue
        found = _class_node(klass)
        if found is None:
            continue
        path, node = found
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                text = comment_above(path, stmt.lineno)
                if text:
                    return text
    return ""


def module_comments(module: ModuleType) -> dict[str, str]:
    """Each module-level name assigned in ``module``'s source and the comment above it."""
    path = source_file(module)
    if path is None:
        return {}
    tree, _, _ = _parsed(path)
    found: dict[str, str] = {}
    for stmt in tree.body:
        targets: list[ast.expr] = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = comment_above(path, stmt.lineno)
    return found


def assignment_order(module: ModuleType) -> list[str]:
    """The module-level names of ``module`` in the order its source assigns or defines them."""
    path = source_file(module)
    if path is None:
        return []
    tree, _, _ = _parsed(path)
    names: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(stmt.name)
    return names


def element_comments(module: ModuleType, name: str) -> list[str]:
    """For a module-level ``name = (a, b, ...)`` (a tuple or list literal): the comment above each element.
    A comment above a run of elements on consecutive lines covers each of them (``framework``,
    ``model``, ``data``: "the selected options' names")."""
    path = source_file(module)
    if path is None:
        return []
    tree, _, _ = _parsed(path)
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(value, (ast.Tuple, ast.List)):
            found: list[str] = []
            for i, element in enumerate(value.elts):
                text = comment_above(path, element.lineno)
                follows = i > 0 and element.lineno == (value.elts[i - 1].end_lineno or 0) + 1
                found.append(text or (found[-1] if follows else ""))
            return found
    return []


#: Sphinx roles in developer docstrings (``:class:`~ddlkit.Run```): in Markdown, a code span
_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|data|attr|exc|obj|const):`(~?)([^`<]*?)(?:\s*<([^>]*)>)?`")


#: reST field lists (``:returns:``, ``:param x:``, ``:raises E:``) and directives (``.. versionadded:: 0.1``)
_FIELD = re.compile(r"^(\s*):(returns?|param|raises?|yields?)(?:\s+(\w+))?:")
_FIELD_WORDS = {
    "return": "Returns",
    "returns": "Returns",
    "param": "Parameter",
    "raise": "Raises",
    "raises": "Raises",
    "yield": "Yields",
    "yields": "Yields",
}
_DIRECTIVE = re.compile(r"^(\s*)\.\. (\w+)::(.*)$")
_DIRECTIVE_WORDS = {
    "versionadded": "Added in version",
    "versionchanged": "Changed in version",
    "deprecated": "Deprecated since version",
}


def markdown(text: str) -> str:
    """A docstring as Markdown, line for line (so its lines keep their numbers): Sphinx roles become
    code spans (``~a.b.c`` shows as ``c``), and a paragraph's closing ``::`` (reST: the indented
    block below is code, which an indented block is in Markdown too) a colon."""

    def role(m: re.Match[str]) -> str:
        target = m.group(3) or m.group(2)
        shown = target.rsplit(".", 1)[-1] if m.group(1) else (m.group(2).strip() or target)
        return f"`{shown}`"

    out = []
    for line in text.splitlines():
        line = _ROLE.sub(role, line)
        line = _FIELD.sub(
            lambda m: (
                m.group(1)
                + _FIELD_WORDS.get(m.group(2), m.group(2).capitalize())
                + (f" `{m.group(3)}`" if m.group(3) else "")
                + ":"
            ),
            line,
        )
        if m := _DIRECTIVE.match(line):
            what, rest = m.group(2), m.group(3).strip()
            line = m.group(1) + (
                f"*{_DIRECTIVE_WORDS[what]} {rest}.*"
                if what in _DIRECTIVE_WORDS
                else f"**{what.capitalize()}:** {rest}".rstrip()
            )
        if line.endswith("::") and not line.strip().startswith(("#", "`")):
            line = line[:-2].rstrip() + ("" if line[:-2].rstrip().endswith(":") else ":")
        out.append(line)
    return "\n".join(out)


def docstring(obj: ModuleType | type) -> Doc | None:
    """``obj``'s docstring (a module's or a class's) as Markdown, with the file and line it starts on."""
    path = source_file(obj)
    raw = obj.__doc__
    if not raw:
        return None
    if path is None:
        return Doc(markdown(inspect.cleandoc(raw)), "<unknown>", 1)
    tree, _, _ = _parsed(path)
    node: ast.AST | None = tree
    if isinstance(obj, type):
        found = _class_node(obj)
        node = found[1] if found else None
    body = getattr(node, "body", [])
    start = 1
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        start = body[0].value.lineno
        raw = body[0].value.value
    lines = raw.splitlines()
    skipped = next((i for i, line in enumerate(lines) if line.strip()), 0)
    return Doc(markdown(inspect.cleandoc(raw)), relative(path), start + skipped)


def first_paragraph(text: str | None) -> str:
    """A docstring's first paragraph, on one line, as Markdown."""
    if not text:
        return ""
    paragraph = inspect.cleandoc(text).split("\n\n", 1)[0]
    return markdown(" ".join(line.strip() for line in paragraph.splitlines()))


def module_of(obj: object) -> ModuleType:
    return sys.modules[obj.__module__]  # type: ignore[attr-defined]
