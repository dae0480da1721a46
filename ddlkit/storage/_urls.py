"""Storage locations: a directory, or a URL ``<scheme>://container/prefix`` that an installed
storage backend opens.

:func:`open_storage` turns either into a :class:`~ddlkit.StorageBackend` whose keys are relative to
it; URL schemes are looked up among the registered storage backends
(:attr:`StorageBackend.url_schemes`), so the core never imports a cloud SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..interfaces import StorageBackend


def is_url(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def split_url(url: str) -> tuple[str, str, str]:
    """``blob://container/a/b`` -> ``("blob", "container", "a/b")``."""
    scheme, _, rest = url.partition("://")
    container, _, prefix = rest.strip("/").partition("/")
    if not container:
        raise ConfigError(f"{url!r} names no container: write {scheme}://<container>[/<prefix>]")
    return scheme, container, prefix.strip("/")


def open_storage(location: str) -> StorageBackend:
    """A backend whose keys are relative to ``location``: a directory, or a URL one of the
    installed storage backends opens (``blob://`` needs ``pip install ddlkit-azure``)."""
    from ..plugins import installed_registry

    registry = installed_registry()
    if not is_url(location):
        # a directory: storage=local, found as every backend is (the SDK names no built-in)
        local = registry.get("storage", "local")
        factory, config = local.factory, local.config
        assert callable(factory) and isinstance(config, type), "Registry.get returns registrations loaded"
        return factory(config(root=str(Path(location.removeprefix("file://")).expanduser())))
    scheme = location.split("://", 1)[0]
    for name in registry.names("storage"):
        backend: Any = registry.get("storage", name).factory  # a StorageBackend class, or another factory
        if scheme in getattr(backend, "url_schemes", ()):
            return backend.from_url(location)
    hint = " Install the Azure plugin: pip install ddlkit-azure." if scheme == "blob" else ""
    raise ConfigError(f"no installed storage backend opens {scheme}:// URLs ({location}).{hint}")
