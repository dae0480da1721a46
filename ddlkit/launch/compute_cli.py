"""``ddlkit compute down [--yes] OVERRIDES``: delete what a compute target keeps between jobs.

The overrides are a run's (the same ``compute=...`` options that created the resources). The
target says what it would delete -- only what ddlkit created (:meth:`ddlkit.ComputeTarget.down`)
-- and deletes it once confirmed: at the terminal's question, or with ``--yes``. Without a
terminal and without ``--yes`` nothing is deleted (exit status 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from ..errors import ConfigError, DdlkitError, exit_code_for
from ..redact import RedactingStream, override_secrets, scrub


def _confirm(lines: Sequence[str], *, yes: bool, out: TextIO) -> bool:
    out.write("ddlkit compute down: will delete\n" + "".join(f"  - {line}\n" for line in lines))
    out.flush()
    if yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError(
            "ddlkit compute down deletes nothing without a confirmation: add --yes (no terminal to ask at)."
        )
    answer = input(f"Delete {'these' if len(lines) > 1 else 'it'}? [y/N] ").strip().lower()
    return answer in ("y", "yes")


def down(overrides: list[str], *, yes: bool, out: TextIO) -> int:
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..config import store_schemas
    from ..plugins import get_plugin_manager
    from ..registry import Registry
    from . import validate

    pm = get_plugin_manager()
    registry = Registry.collect(pm)
    store_schemas(registry)
    try:
        with initialize_config_module("ddlkit.conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:  # an unknown option or key: one line
        first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        raise ConfigError(f"{first} (in the overrides of `ddlkit compute down`).") from None
    target = validate.build_target(cfg, registry)
    validate.validate(cfg, registry, pm, compute=target)
    deleted = target.down(confirm=lambda lines: _confirm(lines, yes=yes, out=out))
    out.write(f"ddlkit compute down: deleted {len(deleted)}\n" if deleted else "ddlkit compute down: nothing deleted\n")
    return 0


def main(argv: list[str], out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddlkit compute", description="Manage what a compute target keeps between jobs."
    )
    parser.add_argument("action", choices=["down"], help="down: delete the resources ddlkit created (it asks first)")
    parser.add_argument("--yes", action="store_true", help="delete without asking")
    parser.add_argument("overrides", nargs="*", help="the run's overrides, e.g. compute=batchai ...")
    args = parser.parse_intermixed_args(argv)
    secrets = override_secrets(args.overrides)
    out = RedactingStream(out or sys.stdout, secrets)
    try:
        return down(list(args.overrides), yes=args.yes, out=out)
    except DdlkitError as err:
        print(f"ddlkit: error: {scrub(str(err), secrets)}", file=sys.stderr)
        return exit_code_for(err)
