"""``ddlkit plan [-m] OVERRIDES``: expand and validate every job of a sweep, print them, run nothing.

It is ``ddlkit -m OVERRIDES`` with the launcher's ``dry_run`` set: the same expansion, the same
composition and validation of every job (a bad value in any job exits 2 and names the job), and
for each job its overrides, compute target, world size, whether a resumed sweep would skip it,
and the command that runs it alone.
"""

from __future__ import annotations

from ...errors import ConfigError

_MULTIRUN_FLAGS = ("-m", "--multirun")


def plan_main(argv: list[str]) -> int:
    from ..cli import _fail, run_main

    launchers = [a.partition("=")[2] for a in argv if a.lstrip("+").startswith("hydra/launcher=")]
    if any(name != "ddlkit" for name in launchers):
        return _fail(ConfigError(f"ddlkit plan works with the ddlkit launcher, not hydra/launcher={launchers[-1]}; "
                                 "drop that override."))
    args = [a for a in argv if a not in _MULTIRUN_FLAGS]
    # a single run's job is planned in the directory the run would have (hydra.run.dir), not a sweep's
    single = ["hydra.sweep.dir=${hydra.run.dir}", "hydra.sweep.subdir=."] if _one_run(argv) else []
    return run_main(["--multirun", *single, *args, "hydra.launcher.dry_run=true"])


def _one_run(argv: list[str]) -> bool:
    """Whether the command line runs one job: no -m, no swept value, no search sweeper."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from ..cli import HydraCommand

    command = HydraCommand.parse(argv)
    if command is None or any(a in _MULTIRUN_FLAGS for a in argv):
        return False
    try:
        parsed = OverridesParser.create().parse_overrides(command.overrides)
    except HydraException:  # the run tells what is wrong with it
        return False
    return not any(o.is_sweep_override() or o.get_key_element().lstrip("+~") == "hydra/sweeper" for o in parsed)
