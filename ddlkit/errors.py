"""Errors raised by ddlkit, named after who has to act on them.

The tree (``x`` an abstract-ish base, ``+`` a concrete error)::

    * DdlkitError                 base of everything ddlkit raises on purpose
      x ConfigError               the user fixes it: a config value, an override, a missing file
        + UnknownNameError        a name that no loaded plugin registered; lists the choices
      x PluginError               the plugin author fixes it
        + PluginLoadError         an entry point failed to import; names distribution and version
        + PluginConflictError     two plugins registered the same name
      x RunError                  a component failed mid-run; carries ``.component`` and ``.step``
        + RankLostError           another rank was lost (left, silent, never joined): infrastructure
        + JobFailedError          a submitted job ended unsuccessfully (launcher side)

Every message says what went wrong *and* what to do next. The CLI turns these into one
readable message and an exit code (:data:`EXIT_CODES`), never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

from .jobdir import EXIT_CONFIG_ERROR, EXIT_FAILED, EXIT_LOST_PEER, EXIT_PLUGIN_ERROR

__all__ = [
    "EXIT_CODES",
    "ConfigError",
    "DdlkitError",
    "JobFailedError",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "RankLostError",
    "RunError",
    "UnknownNameError",
    "exit_code_for",
]


class DdlkitError(Exception):
    """Base class of every error ddlkit raises on purpose."""


class ConfigError(DdlkitError):
    """A problem the user fixes in the config, an override or the environment."""


class UnknownNameError(ConfigError, LookupError):
    """A config name (``framework=pytorh``) that no loaded plugin registered.

    A LookupError rather than a KeyError: ``str(KeyError(msg))`` repr-quotes the message.
    """

    def __init__(
        self, kind: str, name: str, choices: list[str], key: str, not_loaded: Sequence[str] = (), hint: str = ""
    ):
        self.kind, self.name, self.choices, self.key = kind, name, sorted(choices), key
        self.not_loaded = list(not_loaded)
        msg = f"unknown {kind} {name!r} (config key `{key}`). "
        # the plugin that provides it, when it is a first-party option whose plugin is not installed
        msg += f"{hint} " if hint else ""
        msg += f"Choose one of: {', '.join(self.choices)}." if self.choices else "No plugin registers any."
        if self.not_loaded:
            msg += "\n  Not loaded: " + "\n  Not loaded: ".join(self.not_loaded)
        super().__init__(msg)


class PluginError(DdlkitError):
    """A problem the author of a plugin fixes."""


class PluginLoadError(PluginError):
    """An entry-point plugin failed to import."""


class PluginConflictError(PluginError):
    """Two plugins registered the same name for one hook point."""


class RunError(DdlkitError):
    """A component failed while the job was running."""

    def __init__(self, message: str, *, component: str | None = None, step: int | None = None):
        super().__init__(message)
        self.component, self.step = component, step


class RankLostError(RunError):
    """Another rank was lost (it left, went silent past ``dist.timeout_s``, or never joined): this
    rank stops because of the infrastructure, not its own work; exit status ``EXIT_LOST_PEER``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, component="dist")


class JobFailedError(RunError):
    """A submitted job ended with a non-zero status (raised by the launcher)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILED):
        super().__init__(message, component="compute")
        self.exit_code = exit_code


#: Process exit codes of the ``ddlkit`` command, by error class (first match wins).
EXIT_CODES: dict[type[BaseException], int] = {
    UnknownNameError: EXIT_CONFIG_ERROR,
    ConfigError: EXIT_CONFIG_ERROR,
    PluginError: EXIT_PLUGIN_ERROR,
    RankLostError: EXIT_LOST_PEER,
    RunError: EXIT_FAILED,
    DdlkitError: EXIT_FAILED,
}


def exit_code_for(err: BaseException) -> int:
    if isinstance(err, JobFailedError):
        return err.exit_code or EXIT_FAILED
    for cls, code in EXIT_CODES.items():
        if isinstance(err, cls):
            return code
    return EXIT_FAILED
