"""Name -> implementation resolution for the five hook points.

Plugins *register* names through the registration hooks; only this module turns
``storage=local`` into an object. Because every name passes through here, this is the one
place that can detect two plugins claiming a name and list the choices for a typo.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .errors import DdlkitError, PluginConflictError, PluginError, UnknownNameError

if TYPE_CHECKING:
    from .plugins import DdlkitPluginManager

T = TypeVar("T")

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True, slots=True)
class Registration(Generic[T]):
    """One name a plugin offers for a hook point.

    Example::

        @ddlkit.hookimpl
        def ddlkit_storage_backends():
            yield ddlkit.Registration("gcs", GcsStorage, config=GcsStorageConfig,
                                      description="Google Cloud Storage bucket")
    """

    #: what users type in config (``storage=gcs``): lowercase ``[a-z0-9_-]``, starting with a letter
    name: str
    #: usually the class; called as ``factory(cfg)`` with the component's config node
    factory: Callable[..., T]
    #: dataclass schema, stored in Hydra's ConfigStore as ``<group>/<name>``; None = no options
    config: type | None = None
    #: one line shown by ``ddlkit plugins``
    description: str = ""


@dataclass(frozen=True)
class HookPoint:
    """Static facts about one of the five hook points."""

    #: config group / key, e.g. "storage"
    group: str
    #: registration hook name, e.g. "ddlkit_storage_backends"
    hook: str
    #: words used in messages, e.g. "storage backend"
    noun: str
    #: whether the config selects several at once (loggers)
    multi: bool = False


HOOK_POINTS: dict[str, HookPoint] = {
    hp.group: hp
    for hp in (
        HookPoint("data", "ddlkit_data_sources", "data source"),
        HookPoint("storage", "ddlkit_storage_backends", "storage backend"),
        HookPoint("compute", "ddlkit_compute_targets", "compute target"),
        HookPoint("framework", "ddlkit_frameworks", "framework"),
        HookPoint("logger", "ddlkit_loggers", "logger", multi=True),
    )
}


@dataclass(frozen=True)
class Entry:
    registration: Registration[Any]
    #: the plugin object that yielded it, and a printable "dist version (module)" for messages
    plugin: object
    origin: str


@dataclass
class Registry:
    """All registrations, per hook point, collected from a plugin manager."""

    entries: dict[str, dict[str, Entry]] = field(default_factory=dict)
    #: human lines for plugins that failed to load, used to explain a missing name
    not_loaded: list[str] = field(default_factory=list)

    @classmethod
    def collect(cls, pm: DdlkitPluginManager) -> Registry:
        reg = cls(entries={g: {} for g in HOOK_POINTS}, not_loaded=pm.failure_lines())
        conflicts: dict[tuple[str, str], list[Entry]] = {}
        for group, hp in HOOK_POINTS.items():
            hook = getattr(pm.hook, hp.hook)
            for impl in hook.get_hookimpls():
                try:
                    produced = impl.function()
                    items = list(produced) if produced is not None else []
                except Exception as err:  # a plugin's bug must name the plugin
                    origin = pm.describe(impl.plugin)
                    raise PluginError(f"{origin}: hook {hp.hook} raised {type(err).__name__}: {err}") from err
                for item in items:
                    entry = Entry(item, impl.plugin, pm.describe(impl.plugin))
                    _check_registration(hp, entry)
                    existing = reg.entries[group].get(item.name)
                    if existing is not None:
                        conflicts.setdefault((group, item.name), [existing]).append(entry)
                    reg.entries[group][item.name] = entry
        if conflicts:
            (group, name), entries = next(iter(conflicts.items()))
            lines, blockable = [], []
            for e in entries:
                ep = pm.entry_point_name(e.plugin)
                lines.append(f"  - {e.origin}" + (f", entry point {ep!r}" if ep else ""))
                blockable += [ep] if ep else []
            way_out = "Uninstall one"
            if blockable:
                way_out += f", or block one with DDLKIT_DISABLE_PLUGINS=<{' or '.join(blockable)}>"
            raise PluginConflictError(
                f"{HOOK_POINTS[group].noun} {name!r} is registered by {len(entries)} plugins:\n"
                + "\n".join(lines) + f"\n  {way_out}."
            )
        return reg

    def names(self, group: str) -> list[str]:
        return sorted(self.entries[group])

    def get(self, group: str, name: str) -> Registration[Any]:
        try:
            return self.entries[group][name].registration
        except KeyError:
            hp = HOOK_POINTS[group]
            raise UnknownNameError(hp.noun, name, self.names(group), hp.group, self.not_loaded) from None

    def create(self, group: str, name: str, cfg: Any) -> Any:
        """Build the component registered as ``group=name`` from its config node."""
        registration = self.get(group, name)
        try:
            return registration.factory(cfg)
        except DdlkitError:
            raise
        except Exception as err:
            origin = self.entries[group][name].origin
            raise PluginError(
                f"{HOOK_POINTS[group].noun} {name!r} from {origin} failed to initialise: "
                f"{type(err).__name__}: {err}"
            ) from err


def _check_registration(hp: HookPoint, entry: Entry) -> None:
    item = entry.registration
    if not isinstance(item, Registration):
        raise PluginError(
            f"{entry.origin}: hook {hp.hook} must yield ddlkit.Registration objects, got {type(item).__name__}"
        )
    if not _NAME.match(item.name):
        raise PluginError(
            f"{entry.origin}: {hp.noun} name {item.name!r} is invalid; use lowercase letters, digits, '_' or '-', "
            "starting with a letter"
        )
    if item.config is not None and not isinstance(item.config, type):
        raise PluginError(f"{entry.origin}: {hp.noun} {item.name!r}: config must be a dataclass type")


def iter_names(registry: Registry) -> Iterable[tuple[str, str, Entry]]:
    for group, entries in registry.entries.items():
        for name, entry in sorted(entries.items()):
            yield group, name, entry
