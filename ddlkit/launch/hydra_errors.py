"""The user's config as the launcher composed it: its shape checked (:func:`check_composed`), and
Hydra's and OmegaConf's errors about a command line told as ddlkit tells every mistake.

Hydra reports a bad override in six to fourteen lines (its message, OmegaConf's, the key and the
schema's class, a hint to set ``HYDRA_FULL_ERROR``) and suggests ``+key=value`` for a typo, which
would add the typo to the config. :func:`explain` turns such an error into one line that names
the problem and the fix, as a :class:`~ddlkit.errors.ConfigError` (exit status 2):

    `trainer.batch_size=abc` is invalid: 'abc' is not an integer. Give one, e.g. trainer.batch_size=32.
    unknown key `trainer.batchsize`: trainer has no option batchsize. Did you mean `trainer.batch_size`?
    unknown model 'resnet99' (config key `model`). Choose one of: resnet101, resnet152, resnet18, resnet34, resnet50.
    hydra/sweeper=optuna is not installed: pip install hydra-optuna-sweeper
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ..config import CORE_SCHEMAS, named_schema, yaml_error_line
from ..errors import ConfigError, DdlkitError, RunError
from ..first_party import install_hint
from ..registry import HOOK_POINTS, Registry

#: how an unknown key that only ``+key=value`` can have put in the config is named
_ADDED = " (`+` cannot add an option)"
#: the pip package of each of Hydra's sweeper and launcher plugins, by option
HYDRA_PLUGIN_PACKAGES: dict[str, dict[str, str]] = {
    "hydra/sweeper": {
        "optuna": "hydra-optuna-sweeper",
        "ax": "hydra-ax-sweeper",
        "nevergrad": "hydra-nevergrad-sweeper",
    },
    "hydra/launcher": {
        "joblib": "hydra-joblib-launcher",
        "submitit_local": "hydra-submitit-launcher",
        "submitit_slurm": "hydra-submitit-launcher",
        "rq": "hydra-rq-launcher",
        "ray_aws": "hydra-ray-launcher",
    },
}
#: how OmegaConf names a type it could not convert a value to, and how a user reads it
_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "str": "a string"}
#: where experiments come from, for the error that lists them
EXPERIMENT_PLACES = (
    "<name>.yaml files in ./experiments or $DDLKIT_EXPERIMENTS, or experiment/<name>.yaml in "
    "./conf, --config-dir or hydra.searchpath"
)


def explain(err: BaseException) -> DdlkitError | None:
    """``err``, raised while Hydra parsed the command line or composed the config (or the launcher
    wrote a job's files on a full disk), as a ddlkit error; None when it is not about the user's
    input or machine (a bug: the caller lets it through)."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException, SearchPathException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    for link in _chain(err):
        if isinstance(link, OSError) and link.errno == errno.ENAMETOOLONG:  # Hydra making hydra.run.dir
            return ConfigError(
                f"{link.filename} is longer than the file system allows for a path or a name in it: "
                "give hydra.run.dir (or hydra.sweep.dir) a shorter one."
            )
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            # the launcher writing a job's files (its record, a restart's submission) on a full disk
            where = Path(link.filename).parent if link.filename else Path.cwd()
            return RunError(
                f"no space left on the disk of {where} ({os.strerror(link.errno)}): free some (df -h {where}), "
                "then run the same command again: the job resumes from its last checkpoint, which is whole "
                "(checkpoints and results are written to a temporary file and renamed)."
            )
        if isinstance(link, ValueError) and "integer string conversion" in str(link):
            limit = str(link).split(": ", 1)[-1].split(";")[0]
            return ConfigError(f"a number on the command line is too long ({limit}): no setting takes one that big.")
        if isinstance(link, YAMLError):
            where = getattr(getattr(link, "problem_mark", None), "name", None) or "a config file"
            return ConfigError(
                f"{where} is not valid YAML: {yaml_error_line(link)}. Fix the file, or leave out what selects it."
            )
    if isinstance(err, ValueError) and str(err).startswith("Config group override"):
        # the CLI names the override (ddlkit.launch.cli.check_names); this is for a group it did not know of
        return ConfigError(
            f"a config group's option is chosen by name ({_first_line(str(err)).split(':')[0]}): give "
            "its name, quoted if it reads as a number or null (group='0')."
        )
    if isinstance(err, OverrideParseException):
        return ConfigError(
            f"cannot read the override `{err.override}`: {_first_line(err.message)}. Quote a value "
            "holding spaces or any of ()[]{},=$;& for Hydra, inside the shell's quotes: "
            "\"key='a value'\"."
        )
    if isinstance(err, MissingConfigException):
        return _missing_config(err)
    if isinstance(err, SearchPathException):
        where = str(err).split("'")[1] if "'" in str(err) else str(err)
        return ConfigError(
            f"--config-dir {where}: no such directory. Give a directory of presets "
            "(<group>/<name>.yaml) and experiments (experiment/<name>.yaml)."
        )
    if not isinstance(err, (HydraException, OmegaConfBaseException)):
        return None
    cause = err.__cause__ if err.__cause__ is not None else err
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        return _bad_key_or_value(str(err), cause)
    message = _first_line(str(err))
    if message.endswith("raised while composing config:"):  # OmegaConf's own message is on the next line
        where = message.split(":", 1)[0]
        detail = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        full_key = next((line.split(":", 1)[1].strip() for line in detail if line.startswith("full_key:")), None)
        if detail and " not in " in detail[0] and full_key:
            return ConfigError(f"{where}: {unknown_key_message(None, full_key)}")
        message = f"{where}: {detail[0] if detail else message}"
    if "validated against ConfigStore schema with the same name" in str(err):
        name = message.split("'")[1]
        return ConfigError(
            f"the config file {name}.yaml has the name of an option ddlkit or a plugin defines: "
            "rename the file, and name that option in its defaults list to build on it."
        )
    if "does not support sweep type" in message:
        return ConfigError(
            f"hydra/sweeper=basic lists every combination of the values it is given, and cannot "
            f"search a range ({message.rpartition(':')[2].strip().lower()}: interval() or tag()): "
            "give values (a,b,c) or range(start,stop,step), or search it with hydra/sweeper=optuna "
            "(pip install hydra-optuna-sweeper) and sweep.objective=<a result field>."
        )
    merge = re.match(r"In '([\w/]+)/[^']*': Merge error: .* is not a subclass of", message)
    if merge:  # a defaults list's `override /group: [a, b]`: Hydra merges the second option's schema into the first's
        group = merge[1].replace("/", ".")
        return ConfigError(
            f"{group} takes one option, and a config file's defaults list gives it several: choose "
            f"one, or run one job per option with -m {group}=<a>,<b>."
        )
    if message.startswith("Could not append to config. An item is already at"):
        key = message.split("'")[1]
        return ConfigError(f"`{key}` is already in the config: set it without the `+` ({key}=...).")
    return ConfigError(message.rstrip("."))


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)


def _missing_config(err: Any) -> ConfigError:
    missing: str = err.missing_cfg_file or ""
    if str(err).startswith("Cannot find primary config"):  # --config-name's
        return ConfigError(
            f"{_first_line(str(err)).rstrip('.')}: put {missing}.yaml in a directory given with "
            "--config-dir (-cd), or drop --config-name (-cn)."
        )
    group, _, name = missing.rpartition("/")
    options = sorted(err.options or [])
    package = HYDRA_PLUGIN_PACKAGES.get(group, {}).get(name)
    if package:
        return ConfigError(f"{group}={name} is not installed: pip install {package}")
    context = str(err).split("'")[1] if str(err).startswith("In '") else ""
    inside = f" (named in {context}.yaml)" if context and context not in ("config", "hydra/config") else ""
    choices = (
        f"Choose one of: {', '.join(options)}."
        if options
        else "No option is available: is the plugin that registers it installed? (`ddlkit plugins`)"
    )
    if group == "experiment":
        return ConfigError(
            f"unknown experiment {name!r} (`+experiment`){inside}. {choices} Experiments are {EXPERIMENT_PLACES}."
        )
    noun = HOOK_POINTS[group].noun if group in HOOK_POINTS else group.replace("/", " ")
    hint = install_hint(group, name)
    return ConfigError(
        f"unknown {noun} {name!r} (config key `{group.replace('/', '.')}`){inside}. "
        f"{hint + ' ' if hint else ''}{choices}"
    )


def _bad_key_or_value(message: str, cause: Any) -> ConfigError:
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    key: str = cause.full_key
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and not isinstance(cause, ValidationError):
        root = cause.parent_node._get_root() if cause.parent_node is not None else None
        return ConfigError(unknown_key_message(root, key))
    reason = _first_line(cause.msg)
    typed = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", reason)
    enum = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", reason)
    given = (
        message.removeprefix("Error merging override ").strip()
        if message.startswith("Error merging")
        else (f"{key}={cause.value}")
    )
    current = cause.child_node._value() if cause.child_node is not None else None
    example = f", e.g. {key}={getattr(current, 'name', current)}" if current is not None else ""
    if typed:
        return ConfigError(
            f"`{given}` is invalid: '{typed[1]}' is not {_TYPE_WORDS.get(typed[2], typed[2])}. "
            f"Give {_TYPE_WORDS.get(typed[2], 'a ' + typed[2])}{example}."
        )
    if enum:
        return ConfigError(f"`{given}` is invalid: choose one of {enum[2]}.")
    if "is not Optional" in reason or "cannot be assigned None" in reason:
        return ConfigError(f"`{given}` is invalid: {key} cannot be null. Give it a value{example}.")
    return ConfigError(f"`{given}` is invalid: {reason.rstrip('.')}.")


def check_composed(cfg: DictConfig, registry: Registry) -> None:
    """Check the composed config's shape before its values: every component names a registered
    plugin, a preset that names its plugin only by ``name: local_mpi`` gets that plugin's schema
    (so its keys and types are checked as an option's are), and no key is one that no schema
    declares -- ``+trainer.batchsize=8`` opens the config for the typo, and nothing would read it."""
    for group, hp in HOOK_POINTS.items():
        components = cfg.get(group)
        if not isinstance(components, DictConfig):
            continue
        for key in list(components) if hp.multi else [None]:
            node = components[key] if key is not None else components
            if isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict:
                typed = _typed_preset(registry, f"{group}.{key}" if key else group, group, node)
                with read_write(cfg), open_dict(cfg), open_dict(components):
                    if key is None:
                        cfg[group] = typed
                    else:
                        components[key] = typed
    for path, node in _typed_nodes(cfg, ""):
        declared = {f.name for f in dataclasses.fields(OmegaConf.get_type(node))}
        for extra in (k for k in node if k not in declared):
            raise ConfigError(unknown_key_message(cfg, f"{path}.{extra}", _ADDED))
    for extra in (k for k in cfg if k not in HOOK_POINTS and k not in CORE_SCHEMAS):
        raise ConfigError(unknown_key_message(cfg, str(extra), _ADDED))


def _typed_preset(registry: Registry, where: str, group: str, node: DictConfig) -> DictConfig:
    """A preset composed without its plugin's schema (``name: local_mpi``, no defaults list),
    merged onto that schema: its keys and values are checked as an option's are."""
    from omegaconf.errors import OmegaConfBaseException

    name = node.get("name")
    if not isinstance(name, str):
        raise ConfigError(
            f"the {where} preset does not say which {HOOK_POINTS[group].noun} it configures: give it "
            f"a defaults list naming one ({', '.join(registry.names(group))}), or `name: <one of them>`."
        )
    schema = OmegaConf.structured(named_schema(registry.get(group, name).config, name))
    # rooted at the preset's place, so that messages name the keys as the user would write them
    rooted = OmegaConf.create()
    OmegaConf.update(rooted, where, schema, force_add=True)
    for key in node:
        if key not in schema:
            raise ConfigError(unknown_key_message(rooted, f"{where}.{key}"))
    try:
        OmegaConf.update(rooted, where, node, merge=True)
    except OmegaConfBaseException as err:
        raise explain(err) or ConfigError(str(err)) from None
    return OmegaConf.select(rooted, where)


def _typed_nodes(node: DictConfig, path: str) -> Iterator[tuple[str, DictConfig]]:
    """Every dict node typed by a dataclass, below ``node`` (at ``path``)."""
    for key, value in node.items_ex(resolve=False):
        if isinstance(value, DictConfig) and not value._is_none() and not value._is_missing():
            here = f"{path}.{key}" if path else str(key)
            if dataclasses.is_dataclass(OmegaConf.get_type(value)):
                yield here, value
            yield from _typed_nodes(value, here)


def _keys(node: DictConfig, path: str = "") -> Iterator[str]:
    for key, value in node.items_ex(resolve=False):
        here = f"{path}.{key}" if path else str(key)
        if here == "hydra":
            continue
        yield here
        if isinstance(value, DictConfig) and not value._is_none() and not value._is_missing():
            yield from _keys(value, here)


def closest_key(root: DictConfig | None, key: str) -> tuple[str | None, list[str]]:
    """The valid key nearest to ``key`` in the config ``root`` -- the same last part elsewhere
    (``trainer.decay_epochs``: ``optimizer.decay_epochs``), else the closest option of the same
    parent, else the closest key anywhere -- and the parent's options."""
    if root is None:
        return None, []
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(root, parent, default=None) if parent else root
    options = sorted(str(k) for k in node if str(k) not in (last, "hydra")) if isinstance(node, DictConfig) else []
    keys = [k for k in _keys(root) if k != key]
    elsewhere = [k for k in keys if k.rpartition(".")[2] == last]
    if elsewhere:
        return elsewhere[0], options
    near = difflib.get_close_matches(last, options, n=1, cutoff=0.6)
    if near:
        return f"{parent}.{near[0]}" if parent else near[0], options
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    return (near[0] if near else None), options


def unknown_key_message(root: DictConfig | None, key: str, note: str = "") -> str:
    """``unknown key `trainer.batchsize`: trainer has no option batchsize. Did you mean
    `trainer.batch_size`?``, or the parent's options when no key is close."""
    parent, _, last = key.rpartition(".")
    where = f"{parent} has no option {last}" if parent else f"there is no config group or key {last}"
    suggestion, options = closest_key(root, key)
    if suggestion:
        return f"unknown key `{key}`{note}: {where}. Did you mean `{suggestion}`?"
    listed = f" Its options: {', '.join(options)}." if options else ""
    return f"unknown key `{key}`{note}: {where}.{listed}"
