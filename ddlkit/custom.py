"""Bring your own code: objects named by an import path in the config.

``model=custom model.target=my_pkg.nets:build_unet +model.kwargs.depth=4`` and
``data=custom data.target=my_pkg.data:samples`` name a function by ``package.module:attribute``.
The ranks import it from the installed packages and from the directory ``ddlkit`` was started in
(or its snapshot, shipped with the job: :mod:`ddlkit.compute.snapshot`); each framework plugin
registers a ``custom`` model that calls it and checks what it got. This module holds what they
share: the schema, the import paths a config names, the import with its one-line errors, and the
message for an object of the wrong kind.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from .errors import ConfigError

__all__ = ["CustomModelConfig", "build", "import_paths", "import_target", "launch_dir", "wrong_kind"]

#: where the ranks import user code from besides the installed packages: set by the launcher for
#: ranks on its own disk, by the worker to the job's code snapshot elsewhere
LAUNCH_DIR_ENV = "DDLKIT_LAUNCH_DIR"


@dataclass
class CustomModelConfig:
    # what builds the model: "package.module:function" (or a class), called with `kwargs`
    target: str = MISSING
    # keyword arguments for it: +model.kwargs.depth=4
    kwargs: dict[str, Any] = field(default_factory=dict)
    # the loss, "package.module:function" of (outputs, targets) in the framework's convention;
    # null: cross-entropy over data.num_classes logits, with top-1/top-5 (classification)
    loss: str | None = None
    # validation metrics besides val_loss: name -> "package.module:function" of (outputs, targets),
    # the batch's mean; reported as val_<name>
    metrics: dict[str, str] = field(default_factory=dict)


def _split(path: str, key: str) -> tuple[str, str]:
    module, sep, attr = str(path).partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{key}={path} is not an import path: write it as package.module:function.")
    return module, attr


def launch_dir() -> Path:
    """Where user code is imported from: the directory ``ddlkit`` was started in; on a rank, that
    directory on a shared disk, or the job's code snapshot (``$DDLKIT_LAUNCH_DIR``)."""
    return Path(os.environ.get(LAUNCH_DIR_ENV) or os.getcwd())


@contextmanager
def _launch_dir_on_path() -> Iterator[None]:
    """Import as the user's shell would: the directory ``ddlkit`` was started in comes first."""
    where = str(launch_dir())
    added = where not in sys.path
    if added:
        sys.path.insert(0, where)
    try:
        yield
    finally:
        if added:
            sys.path.remove(where)


def import_target(path: str, key: str) -> Any:
    """The object ``package.module:attribute`` names; a ConfigError naming ``key`` and the import
    error if it does not import."""
    module_name, attr = _split(path, key)
    try:
        with _launch_dir_on_path():
            obj: Any = importlib.import_module(module_name)
    except Exception as err:  # whatever the module raises on import, it is the user's to fix
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        raise ConfigError(
            f"{key}={path} does not import ({reason}). Fix the import path, or make the module "
            "importable where the ranks run: an installed package, or a module in the directory "
            "ddlkit is started in."
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{key}={path}: module {module_name} has no {attr!r}.") from None
    return obj


def build(path: str, key: str, kwargs: Any) -> Any:
    """Import ``path`` and call it with ``kwargs``; what it raises is the user's to fix, so it
    becomes a ConfigError naming ``key`` (not a plugin's failure)."""
    fn = import_target(path, key)
    try:
        return fn(**dict(kwargs))
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"{key}={path} raised {type(err).__name__}: {' '.join(str(err).split())}") from err


def check_importable(path: str, key: str) -> None:
    """Launcher-side: ``path``'s module can be found (without running it)."""
    module_name, _ = _split(path, key)
    try:
        with _launch_dir_on_path():
            found = importlib.util.find_spec(module_name)
    except Exception as err:  # a parent package that fails to import
        found, reason = None, " ".join(f"{type(err).__name__}: {err}".split())
    else:
        reason = f"ModuleNotFoundError: No module named {module_name!r}"
    if found is None:
        raise ConfigError(
            f"{key}={path} does not import ({reason}). Fix the import path, or make the module "
            "importable: an installed package, or a module in the directory ddlkit is started in."
        )


def import_paths(config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(key, import path)`` of every import path the config names."""
    model, data = config.get("model") or {}, config.get("data") or {}
    for key, node in (("model.target", model), ("data.target", data)):
        if node.get("target"):
            yield key, node["target"]
    if model.get("loss"):
        yield "model.loss", model["loss"]
    for name, path in (model.get("metrics") or {}).items():
        yield f"model.metrics.{name}", path
    for i, path in enumerate((config.get("trainer") or {}).get("callbacks") or []):
        yield f"trainer.callbacks[{i}]", path


def describe(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def wrong_kind(what: str, obj: Any, framework: str, expected: str) -> ConfigError:
    """``what`` (``model.target=pkg:fn``) gave ``obj``, which ``framework`` cannot train; the hint
    names the installed frameworks that train ``obj``'s library (``Framework.model_libraries``)."""
    from .plugins import installed_registry

    library = type(obj).__module__.split(".")[0]
    registry = installed_registry()
    trainers = {
        name: libraries[library]
        for name in registry.names("framework")
        if library in (libraries := getattr(registry.get("framework", name).factory, "model_libraries", {}))
    }
    hint = (
        f" ({next(iter(trainers.values()))}: use {' or '.join(f'framework={n}' for n in trainers)})" if trainers else ""
    )
    return ConfigError(
        f"{what} returned a {describe(obj)}, not a {expected}: framework={framework} trains {expected} models{hint}."
    )


def output_mismatch(what: str, shape: tuple[int, ...], num_classes: int) -> ConfigError:
    """A classifier whose output is not ``(batch, num_classes)`` logits."""
    if num_classes < 1:
        return ConfigError(
            f"{what} is trained with the classification loss, but the data have no classes "
            "(data.num_classes=0): set model.loss to your task's loss (model=custom)."
        )
    return ConfigError(
        f"{what} outputs shape {tuple(shape)} for a batch of {shape[0] if shape else '?'}, but the data "
        f"have {num_classes} classes (data.num_classes): a classifier must output (batch, "
        f"{num_classes}) logits. Change the model's output size, or set model.loss for another task."
    )


def model_source(cfg: Any) -> str:
    """How messages name the selected model: its import path when it has one."""
    target = cfg.get("target") if hasattr(cfg, "get") else None
    return f"model.target={target}" if target else f"model={cfg.name}"
