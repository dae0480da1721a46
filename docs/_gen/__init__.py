"""The site's generated pages: reference/options.md, how-to/<group>/<name>.md, reference/cli.md,
reference/results.md, reference/sdk.md and benchmarks/, built from the code when the site is built
(docs/gen_pages.py, run by mkdocs-gen-files) so they cannot drift from it.

It lives beside the pages, not in the ``ddlkit`` package: nothing a user runs needs it, and the
tests import it from here (tests/docs). ddlkit and every first-party plugin must be installed.
"""

from __future__ import annotations

from collections.abc import Callable

from . import benchmarks, cli, options, results, sdk
from .source import Doc

#: the generated reference pages, each with its maker
REFERENCE: dict[str, Callable[[], str]] = {
    options.OPTIONS_PAGE: options.options_page,
    "reference/cli.md": cli.page,
    "reference/results.md": results.page,
    "reference/sdk.md": sdk.page,
}


def howto() -> dict[str, str]:
    """how-to/<group>/<name>.md for every registered compute target, storage, framework, data source and logger."""
    return {path: options.howto_page(path, selections) for path, selections in options.howto_pages().items()}


def generate(*, with_cli: bool = True) -> dict[str, str | bytes]:
    """Every generated file of the site, by its path below docs/ (text pages, and the benchmarks' JSON
    and plots as bytes). ``with_cli=False`` leaves out reference/cli.md, which runs ``ddlkit`` a dozen times."""
    pages: dict[str, str | bytes] = {
        path: make() for path, make in REFERENCE.items() if with_cli or path != "reference/cli.md"
    }
    pages.update(howto())
    pages.update(benchmarks.pages())
    return pages


def sources() -> list[tuple[str, Doc]]:
    """The docstrings that generated pages show as Markdown, with the page each is on: the how-to pages'
    module docstrings and the SDK's public modules'. A check of a page's commands reads them here, to name
    the file and line to change."""
    import importlib

    from .source import docstring

    found: list[tuple[str, Doc]] = []
    for path, selections in options.howto_pages().items():
        group = selections[0].partition("=")[0]
        doc = options.howto_doc(group, [s.partition("=")[2] for s in selections])
        if doc is not None:
            found.append((path, doc))
    for module in sdk.public_modules():
        doc = docstring(importlib.import_module(module))
        if doc is not None:
            found.append(("reference/sdk.md", doc))
    return found
