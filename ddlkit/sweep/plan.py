"""``ddlkit plan [-m] OVERRIDES``: expand and validate every job of a sweep, print them, run nothing.

It is ``ddlkit -m OVERRIDES`` with the launcher's ``dry_run`` set: the same expansion, the same
composition and validation of every job (a bad value in any job exits 2 and names the job), and
for each job its overrides, compute target, world size, whether a resumed sweep would skip it,
and the command that runs it alone.
"""

from __future__ import annotations

from ..errors import ConfigError

_MULTIRUN_FLAGS = ("-m", "--multirun")


def plan_main(argv: list[str]) -> int:
    from ..cli import _fail, run_main

    launchers = [a.partition("=")[2] for a in argv if a.lstrip("+").startswith("hydra/launcher=")]
    if any(name != "ddlkit" for name in launchers):
        return _fail(ConfigError(f"ddlkit plan works with the ddlkit launcher, not hydra/launcher={launchers[-1]}; "
                                 "drop that override."))
    args = [a for a in argv if a not in _MULTIRUN_FLAGS]
    return run_main(["--multirun", *args, "hydra.launcher.dry_run=true"])
