"""Name -> implementation resolution for the registration hook points.

Plugins *register* names through the registration hooks; only this module turns
``storage=local`` into an object. Because every name passes through here, this is the one
place that can detect two plugins claiming a name and list the choices for a typo.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ConfigError, DdlkitError, PluginConflictError, PluginError, UnknownNameError
from .first_party import install_hint
from .interfaces.registration import Registration

if TYPE_CHECKING:
    from collections.abc import Sequence


class PluginHooks(Protocol):
    """What :meth:`Registry.collect` reads of a plugin manager (:class:`ddlkit.plugins.DdlkitPluginManager`):
    the registration hooks, and where each plugin comes from, for messages."""

    @property
    def hook(self) -> Any: ...

    def describe(self, plugin: object) -> str: ...

    def failure_lines(self) -> Sequence[str]: ...

    def entry_point_name(self, plugin: object) -> str | None: ...


_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


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
    #: whether each framework registers its own implementation of a name (models, optimizers)
    per_framework: bool = False


HOOK_POINTS: dict[str, HookPoint] = {
    hp.group: hp
    for hp in (
        HookPoint("data", "ddlkit_data_sources", "data source"),
        HookPoint("storage", "ddlkit_storage_backends", "storage backend"),
        HookPoint("compute", "ddlkit_compute_targets", "compute target"),
        HookPoint("framework", "ddlkit_frameworks", "framework"),
        HookPoint("logger", "ddlkit_loggers", "logger", multi=True),
        HookPoint("model", "ddlkit_models", "model", per_framework=True),
        HookPoint("optimizer", "ddlkit_optimizers", "optimizer", per_framework=True),
    )
}


@dataclass(frozen=True)
class Entry:
    #: as the plugin yielded it: its factory and config may still be ``"module:attr"`` strings
    registration: Registration[Any]
    #: the plugin object that yielded it, and a printable "dist version (module)" for messages
    plugin: object
    origin: str
    #: :meth:`loaded`'s result, once asked for
    _loaded: list[Registration[Any]] = field(default_factory=list, init=False, compare=False, repr=False)

    def loaded(self, hp: HookPoint) -> Registration[Any]:
        """The registration with its factory and config imported: a plugin names them by
        ``"module:attr"`` so that loading it imports no implementation, and only the names a
        command chooses are imported (issue 29, item 3). A reference that does not import is the
        plugin's to fix: a PluginError names it."""
        if not self._loaded:
            item = self.registration
            factory = _resolve(self, hp, "factory", item.factory) if isinstance(item.factory, str) else item.factory
            config = _resolve(self, hp, "config", item.config) if isinstance(item.config, str) else item.config
            if config is not None and not isinstance(config, type):
                raise PluginError(f"{self.origin}: {hp.noun} {item.name!r}: config must be a dataclass type")
            self._loaded.append(
                dataclasses.replace(item, factory=factory, config=config)
                if (factory, config) != (item.factory, item.config)
                else item
            )
        return self._loaded[0]


def _resolve(entry: Entry, hp: HookPoint, what: str, ref: str) -> Any:
    import pkgutil

    try:
        return pkgutil.resolve_name(ref)
    except Exception as err:
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        raise PluginError(
            f"{entry.origin}: {hp.noun} {entry.registration.name!r}: its {what} {ref!r} does not import ({reason})"
        ) from err


@dataclass
class Registry:
    """All registrations, per hook point, collected from a plugin manager."""

    #: per group, each name's entry; for a per-framework group (models, optimizers) the first
    #: framework's, with ``config`` the union of every framework's schema for the name
    entries: dict[str, dict[str, Entry]] = field(default_factory=dict)
    #: per-framework groups: ``(framework, name)`` -> that framework's implementation
    implementations: dict[str, dict[tuple[str, str], Entry]] = field(default_factory=dict)
    #: human lines for plugins that failed to load, used to explain a missing name
    not_loaded: list[str] = field(default_factory=list)

    @classmethod
    def collect(cls, pm: PluginHooks) -> Registry:
        reg = cls(
            entries={g: {} for g in HOOK_POINTS},
            not_loaded=list(pm.failure_lines()),
            implementations={g: {} for g, hp in HOOK_POINTS.items() if hp.per_framework},
        )
        #: (group, name) -- (group, (framework, name)) for models and optimizers -> the plugins claiming it
        conflicts: dict[tuple[str, Any], list[Entry]] = {}
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
                    table: dict[Any, Entry] = reg.implementations[group] if hp.per_framework else reg.entries[group]
                    key = (item.framework, item.name) if hp.per_framework else item.name
                    existing = table.get(key)
                    if existing is not None:
                        conflicts.setdefault((group, key), [existing]).append(entry)
                    table[key] = entry
            if hp.per_framework:
                reg.entries[group] = _union_by_name(hp, reg.implementations[group])
        if conflicts:
            (group, key), entries = next(iter(conflicts.items()))
            name = f"{key[1]!r} (framework={key[0]})" if isinstance(key, tuple) else repr(key)
            lines, blockable = [], []
            for e in entries:
                ep = pm.entry_point_name(e.plugin)
                lines.append(f"  - {e.origin}" + (f", entry point {ep!r}" if ep else ""))
                blockable += [ep] if ep else []
            way_out = "Uninstall one"
            if blockable:
                way_out += f", or block one with DDLKIT_DISABLE_PLUGINS=<{' or '.join(blockable)}>"
            raise PluginConflictError(
                f"{HOOK_POINTS[group].noun} {name} is registered by {len(entries)} plugins:\n"
                + "\n".join(lines)
                + f"\n  {way_out}."
            )
        return reg

    def names(self, group: str) -> list[str]:
        return sorted(self.entries[group])

    def get(self, group: str, name: str) -> Registration[Any]:
        """The registration of ``group=name``, its factory and config imported where the plugin
        named them by ``"module:attr"``; an unknown name raises UnknownNameError with the choices."""
        try:
            entry = self.entries[group][name]
        except KeyError:
            hp = HOOK_POINTS[group]
            raise UnknownNameError(
                hp.noun, name, self.names(group), hp.group, self.not_loaded, install_hint(group, name)
            ) from None
        return entry.loaded(HOOK_POINTS[group])

    def selected(self, cfg: Any) -> list[tuple[str, Entry]]:
        """What ``cfg`` selects, as ``(group, entry)``: one per hook point, every logger, and the
        framework's own model and optimizer. An unknown name raises as :meth:`get` does."""
        chosen = []
        for group, hp in HOOK_POINTS.items():
            if hp.per_framework:
                self.get_for(group, cfg.framework.name, cfg[group].name)
                chosen.append((group, self.implementations[group][(cfg.framework.name, cfg[group].name)]))
                continue
            # `logger=[]` (no loggers) leaves the key out of the composed config altogether
            for name in list(cfg.get(group) or {}) if hp.multi else [cfg[group].name]:
                self.get(group, name)
                chosen.append((group, self.entries[group][name]))
        return chosen

    def create(self, group: str, name: str, cfg: Any) -> Any:
        """Build the component registered as ``group=name`` from its config node."""
        registration = self.get(group, name)
        return _call(self.entries[group][name].origin, registration, HOOK_POINTS[group].noun, cfg)

    def frameworks_of(self, group: str, name: str) -> list[str]:
        """The frameworks that implement ``group=name`` (a per-framework group)."""
        return sorted(f for f, n in self.implementations[group] if n == name)

    def names_for(self, group: str, framework: str) -> list[str]:
        """The names of a per-framework group that ``framework`` implements."""
        return sorted(n for f, n in self.implementations[group] if f == framework)

    def get_for(self, group: str, framework: str, name: str) -> Registration[Any]:
        """``framework``'s implementation of ``group=name``; a ConfigError lists what it has."""
        self.get(group, name)  # an unknown name: the choices of every framework
        entry = self.implementations[group].get((framework, name))
        if entry is None:
            hp = HOOK_POINTS[group]
            raise ConfigError(
                f"framework={framework} has no {hp.noun} {name!r} ({hp.noun} {name} is implemented for "
                f"framework={', '.join(self.frameworks_of(group, name))}). Choose one framework={framework} has: "
                f"{', '.join(self.names_for(group, framework)) or '(none)'}."
            )
        return entry.loaded(HOOK_POINTS[group])

    def create_for(self, group: str, framework: str, name: str, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        """Build ``framework``'s ``group=name`` as ``factory(cfg, *args, **kwargs)``."""
        registration = self.get_for(group, framework, name)
        return _call(
            self.implementations[group][(framework, name)].origin,
            registration,
            HOOK_POINTS[group].noun,
            cfg,
            *args,
            **kwargs,
        )


def _call(origin: str, registration: Registration[Any], noun: str, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """``factory(cfg, ...)``; a plugin's failure names the plugin."""
    factory = registration.factory
    assert not isinstance(factory, str), "a registration is called once loaded: its factory imported"
    try:
        return factory(cfg, *args, **kwargs)
    except DdlkitError:
        raise
    except Exception as err:
        raise PluginError(
            f"{noun} {registration.name!r} from {origin} failed to initialise: {type(err).__name__}: {err}"
        ) from err


def _union_by_name(hp: HookPoint, implementations: dict[tuple[str, str], Entry]) -> dict[str, Entry]:
    """One entry per name for a per-framework group, for the config group's option: its schema is
    the union of the frameworks' schemas for that name, so ``model=resnet50 model.x=...`` composes
    whichever framework is selected. A field two frameworks declare must agree in type and default:
    a name means the same option everywhere."""
    by_name: dict[str, list[Entry]] = {}
    for (_, name), entry in sorted(implementations.items()):
        by_name.setdefault(name, []).append(entry)
    merged: dict[str, Entry] = {}
    for name, entries in by_name.items():
        fields: dict[str, tuple[dataclasses.Field, Entry]] = {}
        bases: list[type] = []
        for entry in entries:
            schema = entry.loaded(hp).config  # the union needs every framework's schema for the name
            if schema is None:
                continue
            if not dataclasses.is_dataclass(schema):
                raise PluginError(f"{entry.origin}: {hp.noun} {name!r}: config must be a dataclass type")
            for f in dataclasses.fields(schema):
                seen = fields.get(f.name)
                if seen is not None and _signature(seen[0]) != _signature(f):
                    raise PluginError(
                        f"{hp.noun} {name!r}: option {f.name!r} is declared differently by {seen[1].origin} "
                        f"({_signature(seen[0])}) and {entry.origin} ({_signature(f)}); the plugins must agree, "
                        f"since `{hp.group}.{f.name}` means one thing whichever framework runs."
                    )
                fields.setdefault(f.name, (f, entry))
            if schema not in bases and not any(issubclass(b, schema) for b in bases):
                bases = [b for b in bases if not issubclass(schema, b)] + [schema]
        first = entries[0]
        config = (
            bases[0]
            if len(bases) == 1
            else (dataclasses.make_dataclass(f"{hp.group.title()}_{name}", [], bases=tuple(bases)) if bases else None)
        )
        merged[name] = Entry(dataclasses.replace(first.loaded(hp), config=config), first.plugin, first.origin)
    return merged


def _signature(f: dataclasses.Field) -> str:
    default = (
        f.default
        if f.default is not dataclasses.MISSING
        else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "<required>")
    )
    return f"{getattr(f.type, '__name__', f.type)} = {default!r}"


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
    if item.config is not None and not isinstance(item.config, (type, str)):
        raise PluginError(f"{entry.origin}: {hp.noun} {item.name!r}: config must be a dataclass type")
    for what, ref in (("factory", item.factory), ("config", item.config)):
        module, sep, attr = ref.partition(":") if isinstance(ref, str) else ("-", ":", "-")
        if not (sep and module and attr):
            raise PluginError(
                f"{entry.origin}: {hp.noun} {item.name!r}: {what} {ref!r} is not an import path; "
                'write it as "package.module:attr", or give the object itself'
            )
    if hp.per_framework and not item.framework:
        raise PluginError(
            f"{entry.origin}: {hp.noun} {item.name!r} names no framework: a {hp.noun} is registered "
            'for one framework, Registration(..., framework="<its name>")'
        )
