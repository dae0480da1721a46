"""The ``ddlkit`` command.

``ddlkit [OVERRIDES...]`` composes a run with Hydra and launches it (``--cfg job`` prints the
composed config, ``--help`` lists the groups; ``--detach`` submits and returns at once);
``ddlkit plugins`` lists what is installed; ``ddlkit jobs`` finds submitted jobs again; ``ddlkit
plan`` validates every job of a run or sweep and runs none.

Plugins are loaded and their schemas stored *before* Hydra composes, because Hydra looks
options up in its ConfigStore at composition time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..errors import ConfigError, DdlkitError, RunError, UnknownNameError, exit_code_for
from ..first_party import install_hint
from ..jobdir import EXIT_PREEMPTED
from ..redact import RedactingStream, is_secret_key, override_secrets
from ..registry import HOOK_POINTS, Registry
from .commandline import launch_args

#: ``ddlkit --detach OVERRIDES``: submit the job, print its name, and return without waiting
DETACH_FLAG = "--detach"
#: Hydra's switch for raising its errors (with their tracebacks) rather than printing them
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
#: set while a command runs with its errors going to a file or a pipe: no colour escape codes there
NO_COLOR_ENV = "NO_COLOR"
#: what makes a command line a sweep
_MULTIRUN_FLAGS = ("-m", "--multirun")


def _fail(err: BaseException) -> int:
    code = exit_code_for(err)
    # a job stopped with its checkpoint (Ctrl-C, a pre-emption, a cancel) ended as asked: no error
    print(f"ddlkit: {'' if code == EXIT_PREEMPTED else 'error: '}{err}", file=sys.stderr)
    return code


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


class HydraCommand:
    """The command line as Hydra's own parser reads it, and the config groups' options as Hydra
    finds them for it: ddlkit's and the plugins' schemas, and the user's presets and experiments
    (``./conf``, ``--config-dir``, ``hydra.searchpath``, the experiment directories) -- the options
    ``--help`` and tab completion list, and so the ones the command line accepts."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._loader: Any = None

    @classmethod
    def parse(cls, argv: Sequence[str]) -> HydraCommand | None:
        """None for a command line Hydra will refuse itself (with its usage message)."""
        from hydra._internal.utils import get_args_parser

        parser = get_args_parser()

        def refuse(message: str) -> NoReturn:
            raise ValueError(message)

        parser.error = refuse  # type: ignore[method-assign]
        try:
            return cls(parser.parse_args(list(argv)))
        except (ValueError, SystemExit):
            return None

    @property
    def overrides(self) -> list[str]:
        return list(self.args.overrides)

    def _config_loader(self) -> Any:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra._internal.utils import create_config_search_path
        from hydra.core.config_search_path import SearchPathQuery

        if self._loader is None:
            search_path = create_config_search_path("pkg://ddlkit.conf")
            if self.args.config_dir:
                search_path.prepend(
                    "command-line",
                    f"file://{os.path.abspath(self.args.config_dir)}",
                    anchor=SearchPathQuery(provider="schema"),
                )
            self._loader = ConfigLoaderImpl(config_search_path=search_path)
        return self._loader

    def options(self, group: str) -> list[str]:
        searchpath = [o for o in self.overrides if o.partition("=")[0] == "hydra.searchpath"]
        return self._config_loader().get_group_options(
            group, config_name=self.args.config_name or "config", overrides=searchpath
        )

    def is_group(self, key: str) -> bool:
        """Whether Hydra takes ``key=...`` for the choice of a config group's option (``trainer=...``)."""
        return bool(self._config_loader().repository.group_exists(key))


def check_names(command: HydraCommand, registry: Registry) -> None:
    """Report an unknown ``framework=pytorh`` in our words (with the choices, presets included,
    and any plugin that failed to load) before Hydra composes anything; also checks the
    defaults' own choices. A preset (``compute=mycluster`` from ``conf/compute/mycluster.yaml``)
    is accepted like a registered name; its plugin is checked once it is composed."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ..config import CONF_DIR
    from .hydra_errors import EXPERIMENT_PLACES

    chosen: dict[str, list[str]] = {}
    # libyaml where PyYAML has it: the pure-Python loader (OmegaConf.load) took 2% of a start
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for entry in yaml.load((CONF_DIR / "config.yaml").read_text(encoding="utf-8"), Loader=loader)["defaults"]:
        if not isinstance(entry, str):
            for group, value in entry.items():
                if group in HOOK_POINTS:
                    chosen[group] = _selected_names(value)
    parsed = OverridesParser.create().parse_overrides(command.overrides)
    for ov in parsed:
        _check_group_value(command, ov)
    for ov in parsed:
        key = ov.key_or_group
        if key in HOOK_POINTS and not ov.is_delete():
            chosen[key] = _selected_names(ov.value())
        elif key == "experiment" and not ov.is_delete():
            # without any experiment, Hydra would take `+experiment=x` for a key to add, not a config to select
            known = command.options("experiment")
            for name in _selected_names(ov.value()):
                if name not in known:
                    raise ConfigError(
                        f"unknown experiment {name!r} (`+experiment`). Choose one of: "
                        f"{', '.join(known) or '-'}. Experiments are {EXPERIMENT_PLACES}."
                    )
    for group, names in chosen.items():
        unknown = [n for n in names if n not in registry.names(group)]
        for name in names:
            if name not in unknown:
                registry.get(group, name)  # a plugin's "module:attr" that does not import: its one line, now
        if not unknown:
            continue
        options = command.options(group)
        for name in unknown:
            if name not in options:
                hp = HOOK_POINTS[group]
                raise UnknownNameError(hp.noun, name, options, hp.group, registry.not_loaded, install_hint(group, name))
    experiment = any(ov.key_or_group == "experiment" for ov in parsed)
    for ov in parsed:
        if not ov.is_delete():
            _check_secret_key(ov.key_or_group, chosen, registry, experiment=experiment)


def _check_group_value(command: HydraCommand, ov: Any) -> None:
    """A group's option is chosen by name: ``trainer=0``, ``dist=nan``, ``compute=null``,
    ``~data=1`` reach Hydra's composition as a number or null, and it fails with a traceback."""
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    value = ov.value()
    if isinstance(value, dict) or not command.is_group(ov.key_or_group):
        return  # a dict sets keys of the group's config: Hydra composes that
    if ov.is_delete():  # `~group` or `~group=option`
        values: list[object] = [] if value is None else [value]
    elif isinstance(value, RangeSweep):
        values = [value.start]
    elif isinstance(value, ChoiceSweep):
        values = [x for v in value.list for x in (v if isinstance(v, list) else [v])]
    else:
        values = value if isinstance(value, list) else [value]
    group = ov.key_or_group
    if isinstance(value, list) and group in HOOK_POINTS and not HOOK_POINTS[group].multi and len(value) != 1:
        # `storage=[]` composed a config without storage (which --cfg job printed and a run refused
        # as "unknown key"), `model=[a,b]` Hydra's "Merge error"
        raise ConfigError(
            f"`{ov.input_line}` is invalid: {group} takes one option, and the list gives "
            f"{len(value) or 'none'}. Choose one of: {', '.join(command.options(group)) or '-'} "
            f"({group}=<name>), or run one job per option with -m {group}=<a>,<b>."
        )
    not_names = [v for v in values if not isinstance(v, str)]
    if not not_names:
        return
    bad = not_names[0]
    options = command.options(group)
    shown = "null" if bad is None else str(bad).lower() if isinstance(bad, bool) else str(bad)
    quote = f" (quote a name that reads as a value: {group}='{shown}')" if shown in options else ""
    raise ConfigError(
        f"`{ov.input_line}` is invalid: {group} is a config group, whose option is chosen by name, not "
        f"{shown}. Choose one of: {', '.join(options) or '-'}{quote}."
    )


def _check_secret_key(key: str, chosen: dict[str, list[str]], registry: Registry, *, experiment: bool) -> None:
    """A secret-looking key that is no option of the selected component (``storage.sas_token``
    with ``storage=azure``, with or without ``+``) is refused before Hydra, which would echo its
    value in its error, or with ``+`` add it to the config where nothing reads it."""
    import dataclasses
    import typing

    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in HOOK_POINTS or not is_secret_key(parts[-1]):
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
            hint = (
                f" It takes its credentials from the environment or from a file: see {', '.join(ways)} in "
                f"`ddlkit {group}={name} --help` and docs/how-to/credentials.md."
                if ways
                else ""
            )
            raise ConfigError(
                f"`{key}` is not an option of {group}={name} (the value was not used, and is not shown).{hint}"
            )


def run_main(argv: list[str]) -> int:
    """``ddlkit [--detach] [OVERRIDES]``: the Hydra app. Whatever it prints (Hydra's ``--cfg``,
    ``--info``, ``--help``, its errors, a sweep's plan, the job's output) is scrubbed of the
    secret values on the command line and of credentials in URLs."""
    secrets = override_secrets(argv)
    saved = sys.stdout, sys.stderr
    sys.stdout = RedactingStream(sys.stdout, secrets)
    sys.stderr = RedactingStream(sys.stderr, secrets)
    try:
        return _run_main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _run_main(argv: list[str]) -> int:
    detach = DETACH_FLAG in argv
    argv = [a for a in argv if a != DETACH_FLAG]
    if refused := _refused_flags(argv, detach):
        return _fail(refused)
    from .hydra_errors import explain

    command = HydraCommand.parse(argv)
    try:
        pm, registry, argv = _load_plugins(command, argv)
    except DdlkitError as err:
        return _fail(err)
    except Exception as err:
        return _fail(_explained(err, explain))
    task, entered = _task(registry, pm, detach=detach)

    from .sweep import SWEEP_ATTR, SweepOnDemand

    # `ddlkit -m`: the ddlkit launcher (hydra_plugins/ddlkit_launcher) finds this on the task and validates,
    # prepares and submits every job itself, through the compute target, instead of calling task() per job
    sweep = SweepOnDemand(registry, pm)
    setattr(task, SWEEP_ATTR, sweep)
    code = _run_hydra(task, argv, sweep, multirun=command is not None and command.args.multirun)
    return code if code is not None else entered["code"] or sweep.exit_code or 0


def _refused_flags(argv: list[str], detach: bool) -> ConfigError | None:
    """What is wrong with the command line's own flags, before any plugin loads."""
    if detach and any(a in _MULTIRUN_FLAGS for a in argv):
        return ConfigError(
            f"{DETACH_FLAG} submits one job; a sweep's launcher schedules its jobs as slots free up, "
            "so it must keep running (run it under nohup or tmux, or in a batch job)."
        )
    if detach:
        from . import index

        try:
            index.require_writable()  # before anything is written: a detached job is found again through it
        except ConfigError as err:
            return err
    for key, default in (("hydra.run.dir", "outputs"), ("hydra.sweep.dir", "multirun")):
        # an empty directory would be the working directory: checkpoints and results strewn into it
        if any(a.lstrip("+").partition("=")[::2] in ((key, ""), (key, "''"), (key, '""')) for a in argv):
            return ConfigError(
                f"{key} is empty: give the job a directory of its own, e.g. {key}=runs/r50, "
                f"or leave {key} out ({default}/<date>/<time>)."
            )
    return None


def _load_plugins(command: HydraCommand | None, argv: list[str]) -> tuple[Any, Registry, list[str]]:
    """Load the plugins and store their schemas *before* Hydra composes (it looks options up in
    its ConfigStore then); check the names the command line chooses. Returns the plugin manager,
    the registry and the command line, a swept key's fixed value left out."""
    from ..config import store_schemas
    from ..plugins import get_plugin_manager

    pm = get_plugin_manager()
    registry = Registry.collect(pm)
    store_schemas(registry)
    if command is not None:  # else Hydra refuses the command line, with its usage
        check_names(command, registry)
        if command.args.multirun:
            argv = _sweeps_win(argv, command.overrides)
    return pm, registry, argv


def _task(registry: Registry, pm: Any, *, detach: bool) -> tuple[Callable[[Any], None], dict[str, int | None]]:
    """Hydra's task for one run: prepare the job in the directory Hydra made and run it. Returns
    the task and where it leaves its exit status (0 when Hydra never called it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .hydra_errors import explain

    entered: dict[str, int | None] = {"code": 0}

    def task(cfg: Any) -> None:
        from . import follow, prepare  # here: `--cfg job`, `--help` and a refused config never run a job

        entered["code"] = None
        hc = HydraConfig.get()
        try:
            job = prepare.prepare(
                cfg,
                job_dir=Path(hc.runtime.output_dir),
                overrides=list(hc.overrides.task),
                registry=registry,
                pm=pm,
                env={str(k): str(v) for k, v in hc.job.env_set.items()},
                launch=launch_args(hc),
            )
            follow.run_job(job, detach=detach)
        except (DdlkitError, HydraException, OmegaConfBaseException) as err:
            prepare.remove_empty_dirs(Path(hc.runtime.output_dir))  # Hydra made it; the job never started
            # a task that raises gets Hydra's "Error executing job" line too: config errors end here
            entered["code"] = _fail(err if isinstance(err, DdlkitError) else _explained(err, explain))
            if hc.mode is not None and hc.mode.name == "MULTIRUN":
                return
            sys.exit(entered["code"])
        entered["code"] = 0

    return task, entered


def _run_hydra(task: Callable[[Any], None], argv: list[str], sweep: Any, *, multirun: bool) -> int | None:
    """Run ``task`` as ddlkit's Hydra app on ``argv``, Hydra's errors told in one line; the exit
    status when the app or the sweep chose one, None when the task's own stands."""
    import hydra

    from .compose_once import compose_once
    from .hydra_errors import explain

    app = hydra.main(config_path="../conf", config_name="config", version_base="1.3")(task)
    saved_argv, full_error, no_color = sys.argv, os.environ.get(FULL_ERROR_ENV), os.environ.get(NO_COLOR_ENV)
    sys.argv = ["ddlkit", *argv]
    # Hydra then raises its errors instead of printing them in several lines; ddlkit tells them in one
    os.environ[FULL_ERROR_ENV] = "1"
    if not sys.stderr.isatty() and "FORCE_COLOR" not in os.environ:
        # Optuna's log lines are coloured by colorlog whatever the stream; a log file or a pipe gets
        # the escape codes raw unless NO_COLOR (the convention colorlog and rich follow) says not to
        os.environ[NO_COLOR_ENV] = no_color or "1"
    try:
        with compose_once(argv):
            app()
        sweep.finish()
    except SystemExit as exc:
        if sweep.exit_code is not None:  # the sweep launcher ended the sweep and chose its status
            return sweep.exit_code
        return exc.code if isinstance(exc.code, int) else 1
    except Exception as err:
        if full_error == "1":  # the user asked for Hydra's full traceback
            raise
        if sweep.sweep is not None and isinstance(err, _sweep_error()):  # a sweep job's failure, in words
            print(err, file=sys.stderr)
            return sweep.exit_code or 1
        if isinstance(err, DdlkitError):  # the launcher refused the sweeper's settings
            return _fail(err)
        if multirun and explain(err) is None:
            # the sweeper gave up (Optuna: "No trials are completed yet"): the search did not complete
            return _fail(
                RunError(
                    f"the sweep could not complete: {type(err).__name__}: {_one_line(err)} "
                    f"({FULL_ERROR_ENV}=1 shows where)"
                )
            )
        return _fail(_explained(err, explain))
    finally:
        sys.argv = saved_argv
        if full_error is None:
            os.environ.pop(FULL_ERROR_ENV, None)
        else:
            os.environ[FULL_ERROR_ENV] = full_error
        if no_color is None:
            os.environ.pop(NO_COLOR_ENV, None)
    return None


def _sweep_error() -> type[Exception]:
    from .sweep.sweep import SweepError  # imported with the sweep that raises it

    return SweepError


def _sweeps_win(argv: list[str], overrides: list[str]) -> list[str]:
    """``argv`` without the values given to keys that are also swept (``T trainer.batch_size=8
    'trainer.batch_size=interval(2,6)'``), or searched by the sweeper's ``hydra.sweeper.params``
    (on the command line or in a ``+experiment`` file), each dropped with a note: the sweep gives
    the key its values whatever the order and the sweeper (Hydra's basic sweeper lets the later
    override win, Optuna the fixed value: a search dimension lost in silence)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    swept = {ov.get_key_element(): ov.input_line for ov in parsed if ov.is_sweep_override()}
    params = "hydra.sweeper.params."
    swept.update(
        {ov.get_key_element()[len(params) :]: ov.input_line for ov in parsed if ov.get_key_element().startswith(params)}
    )
    for ov in parsed:
        if ov.get_key_element().lstrip("+") == "experiment" and isinstance(ov.value(), str):
            swept.update(_experiment_params(ov.value()))
    dropped = {
        ov.input_line: ov.get_key_element()
        for ov in parsed
        if not ov.is_sweep_override() and not ov.is_delete() and ov.get_key_element() in swept
    }
    for line, key in dropped.items():
        print(f"ddlkit: note: {line} is left out: the sweep {swept[key]} gives {key} its values", file=sys.stderr)
    return [a for a in argv if a not in dropped]


def _experiment_params(name: str) -> dict[str, str]:
    """The keys experiment ``name`` searches (its ``hydra.sweeper.params``), each with how it says so;
    nothing for an experiment that is not found here (Hydra then says it is unknown)."""
    import yaml

    from ..config import experiment_dirs, user_conf_dirs

    places = [d / f"{name}.yaml" for d in experiment_dirs()] + [
        d / "experiment" / f"{name}.yaml" for d in user_conf_dirs()
    ]
    path = next((p for p in places if p.is_file()), None)
    try:
        params = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("sweeper", {}).get("params")
    except (AttributeError, OSError, yaml.YAMLError):  # no file, or one Hydra will refuse in its own words
        return {}
    if not isinstance(params, dict):
        return {}
    return {str(key): f"of experiment {name} ({key}: {value})" for key, value in params.items()}


def _explained(err: Exception, explain: Callable[[BaseException], DdlkitError | None]) -> DdlkitError:
    """``err`` in ddlkit's words, or raised again: an error that is not about the user's input is a bug."""
    explained = explain(err)
    if explained is None:
        raise err
    return explained


def _one_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def plugins_main(argv: list[str]) -> int:
    """``ddlkit plugins``: every plugin, where it comes from, its hooks and the names it registers."""
    from rich.console import Console
    from rich.table import Table

    from ..plugins import get_plugin_manager

    try:
        pm = get_plugin_manager()
        registry = Registry.collect(pm)
    except DdlkitError as err:
        return _fail(err)
    by_plugin: dict[int, list[str]] = {}
    for group, entries in registry.entries.items():
        if group in registry.implementations:  # models, optimizers: one line per plugin and framework
            names: dict[tuple[int, str], list[str]] = {}
            for (framework, name), entry in sorted(registry.implementations[group].items()):
                names.setdefault((id(entry.plugin), framework), []).append(name)
            for (plugin, framework), these in names.items():
                by_plugin.setdefault(plugin, []).append(f"{group}={','.join(these)} (framework={framework})")
            continue
        for name, entry in sorted(entries.items()):
            by_plugin.setdefault(id(entry.plugin), []).append(f"{group}={name}")
    table = Table(title="ddlkit plugins", show_lines=False)
    for col in ("plugin", "distribution", "version", "registers", "other hooks"):
        table.add_column(col, overflow="fold")
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda np: np[0]):
        info = pm.infos.get(id(plugin))
        # a set: a plugin module may implement a hook more than once (specname=)
        hooks = sorted(
            {h.name for h in pm.get_hookcallers(plugin) or [] if h.name not in {hp.hook for hp in HOOK_POINTS.values()}}
        )
        table.add_row(
            name,
            info.distribution if info else "?",
            info.version if info else "?",
            "\n".join(by_plugin.get(id(plugin), [])) or "-",
            "\n".join(hooks) or "-",
        )
    console = Console(width=max(Console().width, 120))
    console.print(table)
    for failure in pm.failures:
        console.print(
            f"[red]failed to load[/red] {failure.name} from {failure.describe()}: {failure.error}", highlight=False
        )
    return 0


def plan_main(argv: list[str]) -> int:
    """``ddlkit plan [-m] OVERRIDES``: expand and validate every job of a sweep, print them, run
    nothing. It is ``ddlkit -m OVERRIDES`` with the launcher's ``dry_run`` set: the same expansion,
    the same composition and validation of every job (a bad value in any job exits 2 and names the
    job), and for each job its overrides, compute target, world size, whether a resumed sweep would
    skip it, and the command that runs it alone."""
    launchers = [a.partition("=")[2] for a in argv if a.lstrip("+").startswith("hydra/launcher=")]
    if any(name != "ddlkit" for name in launchers):
        return _fail(
            ConfigError(
                f"ddlkit plan works with the ddlkit launcher, not hydra/launcher={launchers[-1]}; drop that override."
            )
        )
    args = [a for a in argv if a not in _MULTIRUN_FLAGS]
    # a single run's job is planned in the directory the run would have (hydra.run.dir), not a sweep's
    single = ["hydra.sweep.dir=${hydra.run.dir}", "hydra.sweep.subdir=."] if _one_run(argv) else []
    # Hydra's parser takes the overrides as one run of words: the user's flags first, then their overrides
    # and these (`ddlkit plan --help` was "unrecognized arguments: hydra.launcher.dry_run=true")
    command = HydraCommand.parse(args)
    overrides = command.overrides if command is not None else []
    flags = list(args)
    for override in overrides:
        flags.remove(override)
    return run_main(["--multirun", *flags, *overrides, *single, "hydra.launcher.dry_run=true"])


def _one_run(argv: list[str]) -> bool:
    """Whether the command line runs one job: no -m, no swept value, no search sweeper."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    command = HydraCommand.parse(argv)
    if command is None or any(a in _MULTIRUN_FLAGS for a in argv):
        return False
    try:
        parsed = OverridesParser.create().parse_overrides(command.overrides)
    except (HydraException, ValueError):  # the run tells what is wrong with it (ValueError: a 5000-digit number)
        return False
    return not any(o.is_sweep_override() or o.get_key_element().lstrip("+~") == "hydra/sweeper" for o in parsed)


def data_main(argv: list[str]) -> int:
    """``ddlkit data prepare|manifest|upload``: see :mod:`ddlkit.launch.data_cli`."""
    from .data_cli import main

    return main(argv)


def jobs_main(argv: list[str]) -> int:
    """``ddlkit jobs list|status|logs|attach|cancel``: see :mod:`ddlkit.launch.jobs.cli`."""
    from .jobs.cli import main

    return main(argv)


def compute_main(argv: list[str]) -> int:
    """``ddlkit compute down [--yes] OVERRIDES``: see :mod:`ddlkit.launch.compute_cli`."""
    from .compute_cli import main

    return main(argv)


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "plugins": plugins_main,
    "plan": plan_main,
    "data": data_main,
    "jobs": jobs_main,
    "compute": compute_main,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    return run_main(args)


def console_main() -> None:
    sys.exit(main())
