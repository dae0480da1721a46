"""``trainer.callbacks``: your own code at the run's lifecycle points, from a config line.

    # my_pkg/cbs.py
    class PrintLr:
        def on_step_end(self, run, step, metrics):
            if run.dist.is_main:
                print(f"step {step}: lr {metrics['lr']:.4g}")

    ddlkit trainer.callbacks=[my_pkg.cbs:PrintLr]

Each entry is an import path, as ``model.target`` is: a class, which every rank calls with no
arguments, or an object. Its methods, all optional, are the lifecycle hooks of
:mod:`ddlkit.hookspecs` under other names, called with the same keyword arguments (or the ones
a method names, as pluggy does for plugins); ``run`` offers what :class:`ddlkit.RunContext`
declares:

================================  ==========================================  ======================
method                            when                                        the hook
================================  ==========================================  ======================
``on_run_start(run)``             before the first step, state restored       ``ddlkit_run_start``
``on_step_end(run, step,          every logging step (``trainer.log_every``)  ``ddlkit_step_end``
metrics)``
``on_epoch_end(run, epoch,        after each epoch's validation               ``ddlkit_epoch_end``
metrics)``
``on_checkpoint_saved(run, path,  after a checkpoint was written (rank 0)      ``ddlkit_checkpoint_saved``
step)``
``on_run_end(run, status,         when the run ends, whatever the outcome     ``ddlkit_run_end``
result)``
================================  ==========================================  ======================

A plugin (an installed package with an entry point) can do the same for every run; a callback
is the common case made a config line. The launcher imports each path before anything runs: one
that does not import, or names an object with none of these methods, is one line, exit 2.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .custom import import_target
from .errors import ConfigError
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .interfaces import RunContext

__all__ = ["METHODS", "CallbackPlugin", "load", "resolve"]

#: a callback's methods, and the hooks they mirror
METHODS = {
    "on_run_start": "ddlkit_run_start",
    "on_step_end": "ddlkit_step_end",
    "on_epoch_end": "ddlkit_epoch_end",
    "on_checkpoint_saved": "ddlkit_checkpoint_saved",
    "on_run_end": "ddlkit_run_end",
}


def _key(i: int) -> str:
    return f"trainer.callbacks[{i}]"


def resolve(paths: Sequence[str]) -> list[Any]:
    """What each import path names (not yet instantiated); a ConfigError for one that does not
    import or has none of the methods."""
    found = []
    for i, path in enumerate(paths):
        obj = import_target(path, _key(i))
        if not any(callable(getattr(obj, name, None)) for name in METHODS):
            raise ConfigError(
                f"{_key(i)}={path} has none of the callback methods {', '.join(METHODS)}: define one "
                "or more of them (see ddlkit.callbacks)."
            )
        found.append(obj)
    return found


def load(paths: Sequence[str]) -> list[Any]:
    """The callbacks of ``trainer.callbacks`` on a rank: classes instantiated, objects as they are."""
    callbacks = []
    for i, obj in enumerate(resolve(paths)):
        if inspect.isclass(obj):
            try:
                obj = obj()
            except Exception as err:  # the user's constructor: theirs to fix
                raise ConfigError(
                    f"{_key(i)}={paths[i]}() raised {type(err).__name__}: {' '.join(str(err).split())}"
                ) from err
        callbacks.append(obj)
    return callbacks


def _caller(method: Callable[..., Any]) -> Callable[[Mapping[str, Any]], Any]:
    """Call ``method`` with the keyword arguments it names (all of them if it takes ``**kwargs``)."""
    params = inspect.signature(method).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda kwargs: method(**kwargs)
    names = {p.name for p in params}
    return lambda kwargs: method(**{k: v for k, v in kwargs.items() if k in names})


class CallbackPlugin:
    """The callbacks as one plugin: each hook calls the callbacks' method for it, in order."""

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.calls: dict[str, list[Callable[[Mapping[str, Any]], Any]]] = {
            name: [_caller(getattr(cb, name)) for cb in callbacks if callable(getattr(cb, name, None))]
            for name in METHODS
        }

    def _call(self, name: str, **kwargs: Any) -> None:
        for call in self.calls[name]:
            call(kwargs)

    @hookimpl
    def ddlkit_run_start(self, run: RunContext) -> None:
        self._call("on_run_start", run=run)

    @hookimpl
    def ddlkit_step_end(self, run: RunContext, step: int, metrics: Mapping[str, float]) -> None:
        self._call("on_step_end", run=run, step=step, metrics=metrics)

    @hookimpl
    def ddlkit_epoch_end(self, run: RunContext, epoch: int, metrics: Mapping[str, float]) -> None:
        self._call("on_epoch_end", run=run, epoch=epoch, metrics=metrics)

    @hookimpl
    def ddlkit_checkpoint_saved(self, run: RunContext, path: str, step: int) -> None:
        self._call("on_checkpoint_saved", run=run, path=path, step=step)

    @hookimpl
    def ddlkit_run_end(self, run: RunContext, status: str, result: Mapping[str, Any] | None) -> None:
        self._call("on_run_end", run=run, status=status, result=result)
