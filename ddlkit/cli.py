"""The ``ddlkit`` command.

``ddlkit [OVERRIDES...]`` composes a run with Hydra and launches it (``--cfg job`` prints the
composed config, ``--help`` lists the groups; ``--detach`` submits and returns at once);
``ddlkit plugins`` lists what is installed; ``ddlkit jobs`` finds submitted jobs again.

Plugins are loaded and their schemas stored *before* Hydra composes, because Hydra looks
options up in its ConfigStore at composition time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import secrets as secret_store
from .errors import ConfigError, DdlkitError, exit_code_for
from .registry import HOOK_POINTS, Registry
from .sweep.plan import plan_main

_GROUP_OVERRIDE_PREFIXES = ("", "+", "++")
#: ``ddlkit --detach OVERRIDES``: submit the job, print its name, and return without waiting
DETACH_FLAG = "--detach"


def _fail(err: BaseException) -> int:
    print(f"ddlkit: error: {err}", file=sys.stderr)
    return exit_code_for(err)


def _selected_names(value: object) -> list[str]:
    """Names selected by a parsed override value: a name, a list of names, or a sweep of either."""
    from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep

    if isinstance(value, ChoiceSweep):
        return [n for v in value.list for n in _selected_names(v)]
    if isinstance(value, (Glob, RangeSweep)):
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)] if value is not None else []


def check_names(overrides: Sequence[str], registry: Registry) -> None:
    """Report an unknown ``framework=pytorh`` in our words (with the choices and any plugin that
    failed to load) before Hydra composes anything; also checks the defaults' own choices."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from .config import CONF_DIR, experiment_dirs

    chosen: dict[str, list[str]] = {}
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if not isinstance(entry, str):
            for group, value in entry.items():
                if group in HOOK_POINTS:
                    chosen[group] = _selected_names(list(value) if not isinstance(value, str) else value)
    # flags (and the values of flags such as `--cfg job`) are Hydra's business, not overrides
    parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o and not o.startswith("-")])
    for ov in parsed:
        key = ov.key_or_group
        if key in HOOK_POINTS and not ov.is_delete():
            chosen[key] = _selected_names(ov.value())
        elif key == "experiment" and not ov.is_delete():
            known = sorted({p.stem for d in experiment_dirs() for p in d.glob("*.yaml")})
            for name in _selected_names(ov.value()):
                if name not in known:
                    where = ", ".join(str(d) for d in experiment_dirs()) or "none exists here"
                    raise ConfigError(
                        f"unknown experiment {name!r} (`+experiment`). Choose one of: {', '.join(known) or '-'}. "
                        f"Experiments are <name>.yaml files in ./experiments or in $DDLKIT_EXPERIMENTS "
                        f"(directories: {where}).")
    for group, names in chosen.items():
        for name in names:
            registry.get(group, name)
    experiment = any(ov.key_or_group == "experiment" for ov in parsed)
    for ov in parsed:
        if not ov.is_delete():
            _check_secret_key(ov.key_or_group, chosen, registry, experiment=experiment)


def _check_secret_key(key: str, chosen: dict[str, list[str]], registry: Registry, *, experiment: bool) -> None:
    """A secret-looking key that is no option of the selected component (``storage.sas_token``
    with ``storage=azure``, with or without ``+``) is refused before Hydra, which would echo its
    value in its error, or with ``+`` add it to the config where nothing reads it."""
    import dataclasses
    import typing

    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in HOOK_POINTS or not secret_store.is_secret_key(parts[-1]):
        return
    group, hp = parts[0], HOOK_POINTS[parts[0]]
    if hp.multi:
        names, path = [parts[1]], parts[2:]
    elif experiment and group not in chosen:  # an experiment may select another option: Hydra decides
        return
    else:
        names, path = chosen.get(group, []), parts[1:]
    for name in names:
        try:
            schema = registry.get(group, name).config
        except DdlkitError:
            continue  # an unselected logger: Hydra reports it
        node: object = schema
        known = bool(path)
        for part in path:
            if not dataclasses.is_dataclass(node):
                known = node is not None  # below a field of no dataclass type (a dict): Hydra decides
                break
            fields = {f.name: f for f in dataclasses.fields(node)}
            if part not in fields:
                known = False
                break
            try:
                node = typing.get_type_hints(node).get(part) if isinstance(node, type) else None
            except Exception:  # an annotation that cannot be resolved here: Hydra decides
                return
        if not known:
            options = sorted(f.name for f in dataclasses.fields(schema)) if dataclasses.is_dataclass(schema) else []
            ways = [o for o in options if o.startswith(parts[-1]) or o.endswith("_file") or o == "auth"]
            hint = (f" It takes its credentials from the environment or from a file: see {', '.join(ways)} in "
                    f"`ddlkit {group}={name} --help` and the README's \"Credentials\"." if ways else "")
            raise ConfigError(f"`{key}` is not an option of {group}={name} (the value was not used, and is "
                              f"not shown).{hint}")


def run_main(argv: list[str]) -> int:
    """``ddlkit [--detach] [OVERRIDES]``: the Hydra app. Whatever it prints (Hydra's ``--cfg``,
    ``--info``, ``--help``, its errors, a sweep's plan, the job's output) is scrubbed of the
    secret values on the command line and of credentials in URLs."""
    secrets = secret_store.override_secrets(argv)
    saved = sys.stdout, sys.stderr
    sys.stdout = secret_store.RedactingStream(sys.stdout, secrets)
    sys.stderr = secret_store.RedactingStream(sys.stderr, secrets)
    try:
        return _run_main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _run_main(argv: list[str]) -> int:
    detach = DETACH_FLAG in argv
    argv = [a for a in argv if a != DETACH_FLAG]
    if detach and any(a in ("-m", "--multirun") for a in argv):
        return _fail(ConfigError(f"{DETACH_FLAG} submits one job; a sweep's launcher schedules its jobs as slots "
                                 "free up, so it must keep running (run it under nohup or tmux, or in a batch job)."))
    for key, default in (("hydra.run.dir", "outputs"), ("hydra.sweep.dir", "multirun")):
        # an empty directory would be the working directory: checkpoints and results strewn into it
        if any(a.lstrip("+").partition("=")[::2] in ((key, ""), (key, "''"), (key, '""')) for a in argv):
            return _fail(ConfigError(f"{key} is empty: give the job a directory of its own, e.g. {key}=runs/r50, "
                                     f"or leave {key} out ({default}/<date>/<time>)."))
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from . import engine
    from .config import store_schemas
    from .plugins import get_plugin_manager

    try:
        pm = get_plugin_manager()
        registry = Registry.collect(pm)
        store_schemas(registry)
        check_names(argv, registry)
    except DdlkitError as err:
        return _fail(err)
    except Exception as err:  # a malformed override: Hydra will explain it below
        if type(err).__name__ != "OverrideParseException":
            raise

    entered = {"code": 0}

    def task(cfg) -> None:
        entered["code"] = None
        hc = HydraConfig.get()
        try:
            job = engine.prepare(cfg, job_dir=Path(hc.runtime.output_dir), overrides=list(hc.overrides.task),
                                 registry=registry, pm=pm, env={str(k): str(v) for k, v in hc.job.env_set.items()})
            engine.run_job(job, detach=detach)
        except DdlkitError as err:
            entered["code"] = _fail(err)
            if hc.mode is not None and hc.mode.name == "MULTIRUN":
                return
            sys.exit(entered["code"])
        entered["code"] = 0

    from .sweep.jobs import SWEEP_ATTR, DdlkitSweep

    # `ddlkit -m`: the ddlkit launcher (hydra_plugins/ddlkit_launcher) finds this on the task and validates,
    # prepares and submits every job itself, through the compute target, instead of calling task() per job
    sweep = DdlkitSweep(registry, pm)
    setattr(task, SWEEP_ATTR, sweep)

    app = hydra.main(config_path="conf", config_name="config", version_base="1.3")(task)
    saved_argv = sys.argv
    sys.argv = ["ddlkit", *argv]
    try:
        app()
    except SystemExit as exc:
        if sweep.exit_code is not None:  # the sweep launcher ended the sweep and chose its status
            return sweep.exit_code
        # Hydra exits 1 for composition errors (bad type, unknown key) before the task runs: those are config errors
        if entered["code"] == 0 and exc.code == 1:
            return 2
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved_argv
    return entered["code"] or sweep.exit_code or 0


def plugins_main(argv: list[str]) -> int:
    """``ddlkit plugins``: every plugin, where it comes from, its hooks and the names it registers."""
    from rich.console import Console
    from rich.table import Table

    from .plugins import get_plugin_manager

    try:
        pm = get_plugin_manager()
        registry = Registry.collect(pm)
    except DdlkitError as err:
        return _fail(err)
    by_plugin: dict[int, list[str]] = {}
    for group, entries in registry.entries.items():
        for name, entry in sorted(entries.items()):
            extra = ""
            models = getattr(entry.registration.factory, "models", ())
            if group == "framework" and models:
                extra = f" (models: {', '.join(models)})"
            by_plugin.setdefault(id(entry.plugin), []).append(f"{group}={name}{extra}")
    table = Table(title="ddlkit plugins", show_lines=False)
    for col in ("plugin", "distribution", "version", "registers", "other hooks"):
        table.add_column(col, overflow="fold")
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda np: np[0]):
        info = pm.infos.get(id(plugin))
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or []
                       if h.name not in {hp.hook for hp in HOOK_POINTS.values()})
        table.add_row(name, info.distribution if info else "?", info.version if info else "?",
                      "\n".join(by_plugin.get(id(plugin), [])) or "-", ", ".join(hooks) or "-")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    for failure in pm.failures:
        console.print(f"[red]failed to load[/red] {failure.name} from {failure.describe()}: {failure.error}",
                      highlight=False)
    return 0


def data_main(argv: list[str]) -> int:
    """``ddlkit data prepare|manifest|upload``: see :mod:`ddlkit.data_cli`."""
    from .data_cli import main

    return main(argv)


def jobs_main(argv: list[str]) -> int:
    """``ddlkit jobs list|status|logs|attach|cancel``: see :mod:`ddlkit.jobs.cli`."""
    from .jobs.cli import main

    return main(argv)


def compute_main(argv: list[str]) -> int:
    """``ddlkit compute down [--yes] OVERRIDES``: see :mod:`ddlkit.compute_cli`."""
    from .compute_cli import main

    return main(argv)


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"plugins": plugins_main, "plan": plan_main, "data": data_main,
                                                      "jobs": jobs_main, "compute": compute_main}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    return run_main(args)


def console_main() -> None:
    sys.exit(main())
