"""The plugin manager: built-ins and entry-point plugins, loaded the same way.

Plugins are found only through the entry-point group ``ddlkit`` (no namespace scanning).
Three environment switches, as in pytest and tox:

* ``DDLKIT_DISABLE_PLUGIN_AUTOLOAD=1`` - load built-ins only;
* ``DDLKIT_DISABLE_PLUGINS=a,b`` - skip the entry points named ``a`` and ``b``;
* ``DDLKIT_TRACE_PLUGINS=1`` - print every hook call to stderr;

and ``DDLKIT_PLUGINS=pkg.module,other.module`` registers extra plugin modules by import path
(as ``PYTEST_PLUGINS`` does), which is how test kits and local experiments add hooks without
packaging them. Child processes inherit all of these, so every rank sees the same plugins.

A plugin whose import fails does not break runs that don't select it: the failure is
remembered and shown by ``ddlkit plugins`` and in any "unknown name" error.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import warnings
from dataclasses import dataclass
from importlib.metadata import Distribution, EntryPoint, distribution, entry_points
from types import ModuleType

import pluggy

from . import hookspecs
from .errors import PluginLoadError
from .registry import Registry

ENTRY_POINT_GROUP = "ddlkit"

#: In-core plugins, registered through exactly the same hooks as third-party ones.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "ddlkit.builtin.run_loop",
    "ddlkit.builtin.local_compute",
    "ddlkit.builtin.local_storage",
    "ddlkit.builtin.synthetic_data",
    "ddlkit.builtin.nfs_storage",
    "ddlkit.builtin.local_ssd_storage",
    "ddlkit.builtin.imagefolder",
    "ddlkit.builtin.custom_data",
    "ddlkit.builtin.console_logger",
    "ddlkit.builtin.jsonl_logger",
)


@dataclass(frozen=True)
class PluginInfo:
    """Where a loaded (or failed) plugin comes from, for messages and ``ddlkit plugins``."""

    #: entry-point name, or the module name for built-ins
    name: str
    distribution: str
    version: str
    module: str
    #: "ImportError: ..." when the plugin failed to load, else None
    error: str | None = None
    #: loaded through the entry-point group (so DDLKIT_DISABLE_PLUGINS=<name> can block it)
    from_entry_point: bool = False

    def describe(self) -> str:
        return f"{self.distribution} {self.version} ({self.module})"


class DdlkitPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers where each plugin came from and what failed."""

    def __init__(self) -> None:
        super().__init__("ddlkit")
        self.add_hookspecs(hookspecs)
        self.infos: dict[int, PluginInfo] = {}
        self.failures: list[PluginInfo] = []

    def register_plugin(self, plugin: ModuleType | object, info: PluginInfo) -> None:
        self.register(plugin, name=info.name)
        self.infos[id(plugin)] = info

    def load_builtins(self) -> None:
        dist_version = _dist_version("ddlkit")
        for modname in BUILTIN_PLUGINS:
            self.register_plugin(importlib.import_module(modname), PluginInfo(modname, "ddlkit", dist_version, modname))

    def load_entrypoints(self, group: str = ENTRY_POINT_GROUP) -> None:
        blocked = {n.strip() for n in os.environ.get("DDLKIT_DISABLE_PLUGINS", "").split(",") if n.strip()}
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            if ep.name in blocked or self.has_plugin(ep.name):
                continue
            dist, ver = _ep_dist(ep)
            try:
                plugin = ep.load()
            except Exception as err:
                info = PluginInfo(
                    ep.name, dist, ver, ep.value, error=f"{type(err).__name__}: {err}", from_entry_point=True
                )
                self.failures.append(info)
                warnings.warn(
                    f"ddlkit plugin {ep.name!r} from {info.describe()} failed to load: {info.error}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            info = PluginInfo(ep.name, dist, ver, ep.value, from_entry_point=True)
            try:
                self.register_plugin(plugin, info)
            except (ValueError, pluggy.PluginValidationError) as err:
                raise PluginLoadError(f"plugin {ep.name!r} from {info.describe()} is invalid: {err}") from err
        try:
            self.check_pending()
        except pluggy.PluginValidationError as err:
            plugin = getattr(err, "plugin", None)
            origin = self.describe(plugin) if plugin is not None else "a plugin"
            raise PluginLoadError(
                f"{origin} implements an unknown hook: {err}. "
                "Hook names start with ddlkit_; see `ddlkit plugins` for the known ones."
            ) from err

    def describe(self, plugin: object) -> str:
        info = self.infos.get(id(plugin))
        return info.describe() if info else repr(plugin)

    def failure_lines(self) -> list[str]:
        return [f"{f.describe()}: {f.error}" for f in self.failures]

    def entry_point_name(self, plugin: object) -> str | None:
        """The entry-point name a plugin was loaded under (what DDLKIT_DISABLE_PLUGINS takes), if any."""
        info = self.infos.get(id(plugin))
        return info.name if info is not None and info.from_entry_point else None


def _dist_version(dist: str) -> str:
    try:
        return _name_and_version(distribution(dist))[1]
    except Exception:
        return "unknown"


def _ep_dist(ep: EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown", "unknown"
    return _name_and_version(dist)


def _name_and_version(dist: Distribution) -> tuple[str, str]:
    """A distribution's name and version, from its metadata's headers alone: ``dist.metadata``
    parses the whole file, long description included (ddlkit's is its README), and again on every
    read -- a twentieth of ``ddlkit --cfg job`` (issue 29, item 3)."""
    import email

    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    headers = email.message_from_string(text.replace("\r\n", "\n").partition("\n\n")[0])
    return headers["Name"] or "unknown", headers["Version"] or "unknown"


def new_plugin_manager(*, autoload: bool | None = None, group: str = ENTRY_POINT_GROUP) -> DdlkitPluginManager:
    """A fresh manager with the specs and built-ins, plus entry points unless autoload is off."""
    pm = DdlkitPluginManager()
    pm.load_builtins()
    if autoload is None:
        autoload = os.environ.get("DDLKIT_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
    if autoload:
        pm.load_entrypoints(group)
    for modname in filter(None, (m.strip() for m in os.environ.get("DDLKIT_PLUGINS", "").split(","))):
        if not pm.has_plugin(modname):
            try:
                module = importlib.import_module(modname)
            except ImportError as err:
                raise PluginLoadError(f"DDLKIT_PLUGINS names {modname!r}, which cannot be imported: {err}") from err
            pm.register_plugin(module, PluginInfo(modname, "DDLKIT_PLUGINS", "-", modname))
    if os.environ.get("DDLKIT_TRACE_PLUGINS", "") not in ("", "0"):
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(msg))
        pm.enable_tracing()
    return pm


@functools.cache
def get_plugin_manager() -> DdlkitPluginManager:
    """The process-wide manager, built on first use (never at import time)."""
    return new_plugin_manager()


def installed_registry() -> Registry:
    """The registrations of the installed plugins (those of :func:`get_plugin_manager`)."""
    return Registry.collect(get_plugin_manager())
