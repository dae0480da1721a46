"""The names of ddlkit's container images (built from ``docker/Dockerfile``).

One image per framework and variant, tagged with ddlkit's version: a remote compute target
uses :func:`default_image` when the user sets no ``compute.image``, and
``scripts/build_images.sh`` tags what it builds with the same names.
"""

from __future__ import annotations

import re

from .._version import __version__
from ..errors import ConfigError

__all__ = ["DEFAULT_REGISTRY", "default_image", "release_frameworks"]

#: where the release images are pushed
DEFAULT_REGISTRY = "docker.io/ddlkit"

# host[:port][/namespace...]: what may stand before "/<framework>:<tag>" in an image reference
_REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*")


def default_image(framework: str, *, gpu: bool = True, registry: str = DEFAULT_REGISTRY) -> str:
    """The image of ``framework`` at this ddlkit's version, e.g. ``docker.io/ddlkit/pytorch:0.1.0-cuda``.

    :param gpu: the CUDA variant (``-cuda``) or the CPU one (``-cpu``).
    :param registry: host and namespace to pull from, e.g. ``myregistry.azurecr.io/ddlkit``.
    :raises ConfigError: a framework ddlkit builds no image for, or a malformed registry.
    """
    frameworks = release_frameworks()
    if framework not in frameworks:
        raise ConfigError(
            f"ddlkit builds no image for framework={framework}; its images are for {', '.join(frameworks)}. "
            "Set compute.image to an image that has ddlkit and your framework's plugin installed."
        )
    registry = registry.rstrip("/")
    if not _REGISTRY.fullmatch(registry):
        raise ConfigError(
            f"{registry!r} is not a registry for an image name: give host[/namespace] in lowercase, without "
            "https://, e.g. myregistry.azurecr.io/ddlkit."
        )
    return f"{registry}/{framework}:{__version__}-{'cuda' if gpu else 'cpu'}"


def release_frameworks() -> list[str]:
    """The installed frameworks that ddlkit's release images are built for (``Framework.release_image``)."""
    from ..plugins import installed_registry

    registry = installed_registry()
    return [name for name in registry.names("framework")
            if getattr(registry.get("framework", name).factory, "release_image", False)]
