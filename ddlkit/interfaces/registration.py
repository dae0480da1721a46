"""What a plugin returns from a registration hook: one name it offers for a hook point."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Registration(Generic[T]):
    """One name a plugin offers for a hook point.

    Example::

        @ddlkit.hookimpl
        def ddlkit_storage_backends():
            yield ddlkit.Registration("gcs", GcsStorage, config=GcsStorageConfig,
                                      description="Google Cloud Storage bucket")

    ``factory`` and ``config`` may also be given as ``"package.module:attr"``, imported only when
    the name is chosen (its options composed, its component built). A plugin then loads
    without importing its implementation, so the ``ddlkit`` command starts as fast whatever is
    installed (issue 29)::

            yield ddlkit.Registration("gcs", "ddlkit_gcs.storage:GcsStorage",
                                      config="ddlkit_gcs.storage:GcsStorageConfig")
    """

    #: what users type in config (``storage=gcs``): lowercase ``[a-z0-9_-]``, starting with a letter
    name: str
    #: usually the class; called as ``factory(cfg)`` with the component's config node; or its
    #: ``"module:attr"``, imported when first needed
    factory: Callable[..., T] | str
    #: dataclass schema, stored in Hydra's ConfigStore as ``<group>/<name>``; None = no options; or
    #: its ``"module:attr"``, imported when the option is first composed
    config: type | str | None = None
    #: one line shown by ``ddlkit plugins``
    description: str = ""
    #: models and optimizers only: the framework (its registered name) this implementation is for;
    #: each framework builds ``model=<name>`` and ``optimizer=<name>`` with its own
    framework: str = ""
    #: distributions whose installed versions a job's ``environment.json`` records when this name
    #: is selected, beside the plugin's own: the libraries it trains or talks with (``("torch",)``)
    packages: tuple[str, ...] = ()
