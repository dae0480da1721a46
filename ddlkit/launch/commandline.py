"""The ``ddlkit`` command lines ddlkit prints -- each job's command in ``ddlkit plan``, the command
that resumes a job or a sweep -- built so that running one reproduces the job exactly.

Two things make that hold. The config's sources travel with the overrides: ``--config-dir``,
``--config-name`` and Hydra overrides such as ``hydra.searchpath``, read back from the job's own
Hydra config, so a job composed from the user's presets is composed from them again. And every
value is quoted twice: for Hydra's override grammar (a job directory with a space or any of
``()[]{},=$;&`` in it, or one named ``null``), then for the shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

#: ddlkit's own config package as Hydra's search path names it (not a flag to repeat)
_DDLKIT_CONF = ("ddlkit/conf", "ddlkit.conf")
#: a value Hydra reads as this string unquoted, unless it reads it as a number, bool or null
_PLAIN = re.compile(r"[\w./-]+")
_NOT_A_STRING = re.compile(r"[-+]?[\d._]*(e[-+]?\d+)?|true|false|null|[-+]?(inf|nan)", re.IGNORECASE)
#: Hydra overrides that belong to the multirun or to the run directory, not to what a job composes
_NOT_A_JOBS_OWN = (
    "hydra.sweep",
    "hydra.sweeper",
    "hydra/sweeper",
    "hydra.launcher",
    "hydra/launcher",
    "hydra.mode",
    "hydra.run.dir",
    "hydra.job.num",
    "hydra.job.id",
)


def hydra_quote(value: str) -> str:
    """``value`` as Hydra reads it back unchanged: as is when it parses as that string, else quoted
    (and ``${`` escaped, so that OmegaConf does not take it for an interpolation)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString
    from hydra.errors import HydraException

    if _PLAIN.fullmatch(value) and not _NOT_A_STRING.fullmatch(value):
        return value
    if "${" not in value:
        try:
            if OverridesParser.create().parse_override(f"k={value}").value() == value:
                return value
        except HydraException:  # it does not parse unquoted
            pass
    return QuotedString(text=value.replace("${", "\\${"), quote=Quote.single).with_quotes()


def override(key: str, value: str) -> str:
    """``key=value`` with the value quoted for Hydra."""
    return f"{key}={hydra_quote(value)}"


def launch_args(hydra: Any) -> list[str]:
    """What composes a job besides its own overrides, from its Hydra config (``cfg.hydra``): the
    config directory and primary config chosen with flags, and the Hydra overrides that shape the
    job (``hydra.searchpath``, ``hydra.job.env_set.*``, ...) -- not those of the multirun itself."""
    args: list[str] = []
    for source in hydra.runtime.get("config_sources") or []:
        if source.schema != "file":
            continue
        if source.provider == "command-line":
            args += ["--config-dir", source.path]
        elif source.provider == "main" and source.path not in _DDLKIT_CONF:
            args += ["--config-path", source.path]
    name = hydra.job.get("config_name")
    if name and name != "config":
        args += ["--config-name", str(name)]
    args += [o for o in hydra.overrides.hydra if not o.lstrip("+~").startswith(_NOT_A_JOBS_OWN)]
    return args


def job_command(overrides: Sequence[str], job_dir: object, launch: Sequence[str] = ()) -> str:
    """The shell command that runs the job of ``overrides`` in ``job_dir`` (again: it resumes)."""
    kept = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    return shlex.join(["ddlkit", *launch, *kept, override("hydra.run.dir", str(job_dir))])
