"""reference/options.md (every config group and option) and how-to/<group>/<name>.md (one page per
registered compute target, storage, framework, data source and logger)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from ddlkit.config import BACKENDS, CONF_DIR, CORE_SCHEMAS
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.registry import HOOK_POINTS, Entry, Registry

from .source import ROOT, Doc, docstring, first_paragraph
from .tables import Option, options, table, yaml_value

OPTIONS_PAGE = "reference/options.md"


@dataclass(frozen=True)
class Installed:
    """The installed plugins' registrations, as ``ddlkit`` loads them."""

    pm: DdlkitPluginManager
    registry: Registry


@functools.cache
def installed() -> Installed:
    """The built-ins and every plugin installed through the ``ddlkit`` entry point group (not
    ``DDLKIT_PLUGINS``' extra modules: the pages describe what is installed). Every first-party
    plugin (``plugins/*``) must be: the site documents them all."""
    pm = DdlkitPluginManager()
    pm.load_builtins()
    pm.load_entrypoints()
    if pm.failures:
        raise RuntimeError("plugins failed to load: " + "; ".join(pm.failure_lines()))
    loaded = {info.distribution for info in pm.infos.values()}
    missing = [
        p.name for p in sorted((ROOT / "plugins").glob("*/pyproject.toml")) for p in [p.parent] if p.name not in loaded
    ]
    if missing:
        raise RuntimeError(
            "the documentation covers every first-party plugin, and these are not installed: "
            + ", ".join(missing)
            + " (pip install -r requirements-test.txt)"
        )
    return Installed(pm, Registry.collect(pm))


def defaults() -> dict[str, Any]:
    """Each group's default option (ddlkit's conf/config.yaml), and the values it sets itself."""
    conf = yaml.safe_load((CONF_DIR / "config.yaml").read_text(encoding="utf-8"))
    chosen = {}
    for entry in conf["defaults"]:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if not key.startswith("override "):
                    chosen[key] = value
    return {"chosen": chosen, "values": {k: v for k, v in conf.items() if k not in ("defaults", "hydra")}}


def _flat(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _flat(value, f"{prefix}.{key}")
    else:
        yield prefix, node


def section_anchor(group: str, name: str | None = None) -> str:
    """The anchor of a section of reference/options.md: ``trainer``, ``compute-slurm``, ``logger-wandb``."""
    return group if name is None else f"{group}-{name}"


def key_prefix(group: str, name: str) -> str:
    return f"{group}.{name}" if HOOK_POINTS[group].multi else group


def _only(group: str, name: str) -> dict[str, str]:
    """For a per-framework name (models, optimizers): the fields some of its frameworks lack."""
    hp = HOOK_POINTS[group]
    if not hp.per_framework:
        return {}
    reg = installed().registry
    frameworks = reg.frameworks_of(group, name)
    declared: dict[str, list[str]] = {}
    for framework in frameworks:
        schema = reg.implementations[group][(framework, name)].loaded(hp).config
        for f in dataclasses.fields(schema) if schema is not None else ():
            declared.setdefault(f.name, []).append(framework)
    return {
        field: "framework=" + ", ".join(fws) + " only" for field, fws in declared.items() if len(fws) < len(frameworks)
    }


def rows(group: str, name: str | None = None) -> list[Option]:
    """The option table's rows of a top-level key (``name`` None) or of ``group=name``."""
    if name is None:
        return list(options(CORE_SCHEMAS[group], group, section_anchor(group)))
    schema = installed().registry.get(group, name).config
    if schema is None:
        return []
    return list(options(schema, key_prefix(group, name), section_anchor(group, name), only=_only(group, name)))


def provider(entry: Entry) -> tuple[str, str | None]:
    """Who provides a registration, in words, and the command that installs it (None: built in)."""
    info = installed().pm.infos.get(id(entry.plugin))
    dist = info.distribution if info else "?"
    if dist == "ddlkit":
        return "built into ddlkit", None
    extras = importlib.metadata.metadata(dist).get_all("Provides-Extra") or []
    name = entry.registration.name
    where = f"./plugins/{dist}" if (ROOT / "plugins" / dist).is_dir() else dist
    target = f"'{where}[{name}]'" if name in extras else where
    return f"the `{dist}` plugin", f"pip install -e {target}" if where != dist else f"pip install {target}"


def component_module(entry: Entry) -> str:
    """The module that defines a registration's component (its factory)."""
    factory = entry.registration.factory
    return factory.partition(":")[0] if isinstance(factory, str) else factory.__module__


def howto_pages() -> dict[str, list[str]]:
    """how-to/<group>/<name>.md -> the names it documents: one page per component module of each
    single-implementation group (compute, storage, framework, data, logger); names whose classes
    share a module share its page (``compute=local_mpi`` and ``compute=mpi``), named after the first."""
    reg = installed().registry
    pages: dict[str, list[str]] = {}
    for group, hp in HOOK_POINTS.items():
        if hp.per_framework:
            continue
        by_module: dict[str, list[str]] = {}
        for name in reg.names(group):
            by_module.setdefault(component_module(reg.entries[group][name]), []).append(name)
        for names in by_module.values():
            pages[f"how-to/{group}/{names[0]}.md"] = [f"{group}={n}" for n in names]
    return pages


def howto_doc(group: str, names: list[str]) -> Doc | None:
    """The module docstring a how-to page shows (its text is the page's body)."""
    entry = installed().registry.entries[group][names[0]]
    return docstring(importlib.import_module(component_module(entry)))


def howto_page(path: str, selections: list[str]) -> str:
    group = selections[0].partition("=")[0]
    names = [s.partition("=")[2] for s in selections]
    reg = installed().registry
    entry = reg.entries[group][names[0]]
    who, install = provider(entry)
    out = [f"# {' and '.join(selections)}", ""]
    for name in names:
        description = reg.entries[group][name].registration.description
        if description:
            out += [
                f"`{group}={name}`: {description}."
                if not description.endswith(".")
                else f"`{group}={name}`: {description}",
                "",
            ]
    out.append(f"Provided by {who}" + (": install it with" if install else ".") + "")
    if install:
        out += ["", "```bash", install, "```"]
    out.append("")
    doc = howto_doc(group, names)
    if doc is not None:
        out += [doc.text, ""]
    depth = "../" * (path.count("/"))
    for name in names:
        title = "Options" if len(names) == 1 else f"Options of {group}={name}"
        out += [f"## {title}", ""]
        prefix = key_prefix(group, name)
        out.append(
            f"Set them as `{prefix}.<key>=<value>` on the command line or in a preset; "
            f"[the reference]({depth}{OPTIONS_PAGE}#{section_anchor(group, name)}) has every group's."
        )
        out += ["", table(rows(group, name), link=f"{depth}{OPTIONS_PAGE}")]
    return "\n".join(out)


def _defaults_note(group: str) -> str:
    values = dict(_flat(defaults()["values"].get(group, {}), group))
    if not values:
        return ""
    shown = ", ".join(f"`{k}={yaml_value(v)}`" for k, v in values.items())
    return f"ddlkit's default config (`ddlkit/conf/config.yaml`) sets {shown} over the option's own default.\n\n"


def options_page() -> str:
    reg = installed().registry
    chosen = defaults()["chosen"]
    pages = {s: path for path, sels in howto_pages().items() for s in sels}
    out = [
        "# Options",
        "",
        "Every option of ddlkit's configuration, with the plugins installed where this site was built: "
        "generated from the schemas (each field's type, default, rule and the comment above it in the "
        "source), so it lists what `ddlkit` accepts. Set a key on the command line "
        "(`ddlkit trainer.epochs=5 compute.nodes=2`), in a preset (`conf/<group>/<name>.yaml`) or in an "
        "experiment; `ddlkit --cfg job` prints the composed config, and `ddlkit plan` checks it. A value "
        "that breaks its constraint is refused before anything runs, in one line naming the key (exit "
        "status 2).",
        "",
        "## Top-level options",
        "",
        "The core's own settings, the same whatever the plugins.",
        "",
    ]
    for group, schema in CORE_SCHEMAS.items():
        out += [f"### {group}", ""]  # its anchor: the heading's own, the group's name
        doc = (
            first_paragraph(schema.__doc__)
            if schema.__doc__ and not schema.__doc__.startswith(f"{schema.__name__}(")
            else ""
        )
        if doc:
            out += [doc, ""]
        if group == "dist":
            out += [f"`dist={'|'.join(BACKENDS)}` (default `{chosen.get('dist')}`) selects `dist.backend`.", ""]
        out.append(_defaults_note(group))
        out.append(table(rows(group)))
    out += [
        "## Config groups",
        "",
        "Each group's option is chosen by name (`compute=slurm`; several loggers at once: "
        "`logger=[console,wandb]`), and brings its own keys. A preset of yours "
        "(`conf/<group>/<name>.yaml`) is chosen the same way.",
        "",
    ]
    for group, hp in HOOK_POINTS.items():
        names = reg.names(group)
        default = chosen.get(group)
        default_text = ", ".join(default) if isinstance(default, list) else default
        out += [
            f"### {group}",
            "",
            f"`{group}=<name>`, one of: {', '.join(f'[{n}](#{section_anchor(group, n)})' for n in names)}"
            + (f" (default: {default_text})." if default_text else "."),
            "",
        ]
        if hp.multi:
            out += [f"Several at once: `{group}=[a,b]`; each one's keys are below `{group}.<name>.`", ""]
        if hp.per_framework:
            out += [
                f"Each framework implements its own {hp.noun}s; the keys below are those of every "
                "framework's implementation (a key only some declare says so).",
                "",
            ]
        out.append(_defaults_note(group))
        for name in names:
            entry = reg.entries[group][name]
            out += [f'#### {group}={name} <a id="{section_anchor(group, name)}"></a>', ""]
            facts = []
            if entry.registration.description:
                facts.append(entry.registration.description.rstrip(".") + ".")
            if hp.per_framework:
                facts.append(
                    "Implemented by " + ", ".join(f"framework={f}" for f in reg.frameworks_of(group, name)) + "."
                )
            else:
                who, install = provider(entry)
                facts.append(f"Provided by {who}" + (f" (`{install}`)." if install else "."))
            page = pages.get(f"{group}={name}")
            if page:
                facts.append(f"How to use it: [{page.removesuffix('.md')}](../{page}).")
            out += [" ".join(facts), "", table(rows(group, name))]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out))
