"""The plugin SDK is pinned: first-party plugins import ddlkit's public modules only.

A public module is one in :data:`PUBLIC_MODULES`, or a submodule of one of its packages (the facade
``ddlkit`` aside) whose name has no part starting with ``_``: ``ddlkit.interfaces.data`` and
``ddlkit.testing.contracts`` are public, ``ddlkit.storage._staging`` and ``ddlkit.compute._minder``
are not. Everything else -- the launcher wing ``ddlkit.launch``, the rank wing ``ddlkit.rank``, the
built-in plugins ``ddlkit.builtin`` and the core's own modules -- may change without notice, so a
plugin that imports it breaks with the next release. The plugin author's guide,
docs/plugins/write-a-plugin.md ("The plugin SDK"), lists the same modules.

``hydra_plugins/`` ships in the ``ddlkit`` distribution (Hydra finds its plugins in that namespace
package only): it is the launcher wing's face to Hydra, and may import :data:`HYDRA_PLUGINS_MAY_ALSO_USE`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: the modules a plugin may import from ddlkit (and, for packages, their submodules without a leading _)
PUBLIC_MODULES = (
    "ddlkit",
    "ddlkit.atomic",
    "ddlkit.callbacks",
    "ddlkit.compute",
    "ddlkit.cpu",
    "ddlkit.custom",
    "ddlkit.errors",
    "ddlkit.horovod",
    "ddlkit.images",
    "ddlkit.interfaces",
    "ddlkit.jobdir",
    "ddlkit.optim",
    "ddlkit.options",
    "ddlkit.redact",
    "ddlkit.result",
    "ddlkit.storage",
    "ddlkit.testing",
    "ddlkit.threads",
)

#: the launcher wing and its config, which the core's Hydra plugins drive (see the module docstring)
HYDRA_PLUGINS_MAY_ALSO_USE = ("ddlkit.config", "ddlkit.launch")

#: the SDK packages whose ``__init__`` re-exports their private modules' public names
SDK_FACADES = ("ddlkit.images", "ddlkit.storage")


def is_public(module: str, public: tuple[str, ...] = PUBLIC_MODULES) -> bool:
    if module in public:
        return True
    parts = module.split(".")
    return any(module.startswith(f"{package}.") and package != "ddlkit" for package in public) and not any(
        part.startswith("_") for part in parts
    )


def is_module(name: str) -> bool:
    """Whether ``ddlkit.<...>`` names a module (``from ddlkit import cpu``) rather than an attribute."""
    return importlib.util.find_spec(name) is not None


def ddlkit_imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import of a ddlkit module in ``path``, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ddlkit" or alias.name.startswith("ddlkit."):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "ddlkit":
                # `from ddlkit import builtin` imports a module, not a name of the facade
                yield node.lineno, "ddlkit"
                for alias in node.names:
                    if is_module(f"ddlkit.{alias.name}"):
                        yield node.lineno, f"ddlkit.{alias.name}"
            elif node.module.startswith("ddlkit."):
                yield node.lineno, node.module


def sources() -> Iterator[tuple[Path, tuple[str, ...]]]:
    # a plugin's test suite too: what it needs of the core's internals, ddlkit.testing.core names
    for path in sorted([*REPO.glob("plugins/*/src/**/*.py"), *REPO.glob("plugins/*/tests/**/*.py")]):
        yield path, PUBLIC_MODULES
    for path in sorted(REPO.glob("hydra_plugins/**/*.py")):
        yield path, PUBLIC_MODULES + HYDRA_PLUGINS_MAY_ALSO_USE


def private_imports() -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line}: imports {module}, which is not public"
        for path, public in sources()
        for line, module in ddlkit_imports(path)
        if not is_public(module, public)
    ]


def test_the_walk_sees_every_plugin() -> None:
    walked = {path.relative_to(REPO).parts[:2] for path, _ in sources()}
    assert {("plugins", p.name) for p in (REPO / "plugins").iterdir() if (p / "src").is_dir()} < walked
    assert any(path.parts[-3:-1] == ("ddlkit-ray", "tests") for path, _ in sources())
    assert ("hydra_plugins", "ddlkit_launcher") in walked


def test_plugins_import_only_public_modules() -> None:
    found = private_imports()
    assert not found, (
        "plugins must import ddlkit's public modules only (docs/plugins/write-a-plugin.md: The plugin "
        "SDK); export what they need from one, or stop needing it:\n" + "\n".join(found)
    )


def test_a_private_import_is_found(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import ddlkit\nfrom ddlkit import cpu, builtin\nfrom ddlkit.storage import stage\n\n"
        "def f():\n    from ddlkit.storage._staging import stage\n    import ddlkit.rank.run\n"
    )
    private = [(line, module) for line, module in ddlkit_imports(plugin) if not is_public(module)]
    assert private == [(2, "ddlkit.builtin"), (6, "ddlkit.storage._staging"), (7, "ddlkit.rank.run")]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_module_exists_and_says_what_it_is_for(module: str) -> None:
    assert importlib.util.find_spec(module) and importlib.import_module(module).__doc__, module


@pytest.mark.parametrize("module", SDK_FACADES)
def test_an_sdk_facade_exports_sorted_public_names(module: str) -> None:
    mod = importlib.import_module(module)
    order = sorted(set(mod.__all__), key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert mod.__all__ == order
    for name in mod.__all__:
        assert name in mod.__doc__ and getattr(mod, name) is not None, name


def test_the_docs_list_the_public_modules() -> None:
    readme = (REPO / "docs" / "plugins" / "write-a-plugin.md").read_text(encoding="utf-8")
    section = readme.split("## The plugin SDK", 1)[1].split("\n## ", 1)[0]
    listed = tuple(sorted(set(re.findall(r"^- `(ddlkit(?:\.\w+)*)`", section, flags=re.MULTILINE))))
    assert listed == tuple(sorted(PUBLIC_MODULES))
