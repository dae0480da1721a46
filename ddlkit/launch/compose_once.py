"""A run's config composed once, where Hydra composes it twice.

To dispatch a command line to ``run`` or ``multirun``, Hydra reads ``hydra.mode`` from a config it
composes for that alone (``Hydra.get_mode``, in multirun mode, its sweep overrides unchecked), throws
it away, and composes the config again to run (Hydra issue #3440, open): 0.14 s of every ``ddlkit``
start, a fifth of the launcher's time. :func:`compose_once` keeps the first composition and hands it
to the run when it is what the second would have composed:

* the run is a single run (``hydra.mode`` RUN, by the command line or by a config);
* the command line holds no sweep override (no ``,`` and no ``(`` in any override: a sweep syntax such
  as ``a,b`` or ``range(..)`` is refused in a single run by the second composition's check);
* no config group was left without a choice (``???``, which the first composition skips and the
  second refuses with Hydra's "You must specify" error).

Otherwise, and for ``-m``, Hydra composes twice as it always does. The one difference a run could
see is the override Hydra adds for the mode it chose (``hydra.mode=RUN``), which is applied here as
Hydra applies it. ``tests/test_compose_once.py`` compares both ways, key for key.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

#: the override Hydra adds for a run whose configs do not set hydra.mode
_MODE_RUN = "hydra.mode=RUN"


@contextlib.contextmanager
def compose_once(overrides: Sequence[str]) -> Iterator[None]:
    """Within this block, a Hydra app run on ``overrides`` composes its config once (see above)."""
    from hydra._internal import hydra as hydra_internal
    from hydra.types import RunMode

    if any("," in o or "(" in o for o in overrides):  # maybe a sweep: Hydra's checks decide
        yield
        return
    cls = hydra_internal.Hydra
    original = cls.compose_config
    kept: dict[str, Any] = {}

    def compose_config(
        self: Any,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        with_log_configuration: bool = False,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> Any:
        first = kept.pop("first", None)  # reused once at most
        if first is not None and run_mode == RunMode.RUN and _same_run(first, config_name, overrides):
            cfg = first[2]
            if len(overrides) > len(first[1]):  # Hydra added the mode it chose
                cfg.hydra.mode = RunMode.RUN
                cfg.hydra.overrides.hydra.append(_MODE_RUN)
            if with_log_configuration:  # what Hydra.compose_config does after composing
                from hydra.core.utils import configure_log

                configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
                hydra_internal.log = logging.getLogger(hydra_internal.__name__)
                self._print_debug_info(config_name, overrides, run_mode)
            return cfg
        cfg = original(
            self, config_name, overrides, run_mode, with_log_configuration, from_shell, validate_sweep_overrides
        )
        if run_mode == RunMode.MULTIRUN and not validate_sweep_overrides and not with_log_configuration:
            kept["first"] = (config_name, list(overrides), cfg)  # Hydra.get_mode's, which reads hydra.mode only
        return cfg

    cls.compose_config = compose_config
    try:
        yield
    finally:
        cls.compose_config = original


def _same_run(first: tuple[str | None, list[str], Any], config_name: str | None, overrides: list[str]) -> bool:
    from omegaconf import OmegaConf

    name, first_overrides, cfg = first
    choices = cfg.hydra.runtime.choices
    return (
        name == config_name
        and list(overrides) in (first_overrides, [*first_overrides, _MODE_RUN])
        and not any(OmegaConf.is_missing(choices, group) for group in choices)
    )
