"""Writing a job's directory: the resolved job file (secrets redacted, no launcher path in it), the
config copies and the environment record, the job's name, and what its ranks' environment needs.
A directory another run of the job is still using is refused before anything is written."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from ..atomic import write_json, write_text
from ..checkpoint import resolve_resume
from ..compute.secret_env import SECRETS_ENV, encode
from ..compute.snapshot import CodeSnapshot, imports_from
from ..custom import LAUNCH_DIR_ENV, import_paths, launch_dir
from ..errors import ConfigError, DdlkitError
from ..interfaces import ComputeTarget, JobSpec
from ..jobdir import CODE_DIR, CODE_FILE, CONFIG_FILE, ENVIRONMENT_FILE, JOB_FILE, OVERRIDES_FILE
from ..redact import is_secret_key, redact_overrides, split_secrets
from ..registry import Registry
from . import index
from .commandline import job_command
from .validate import build_target, validate

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..plugins import DdlkitPluginManager

#: what the launcher passes on to the ranks from its own environment: which plugins to load
FORWARDED_ENV = ("DDLKIT_PLUGINS", "DDLKIT_DISABLE_PLUGINS", "DDLKIT_DISABLE_PLUGIN_AUTOLOAD", "DDLKIT_TRACE_PLUGINS")


#: the core's own distributions, recorded in every environment.json; each selected component adds
#: its plugin's distribution and the libraries its registration names (``Registration.packages``)
CORE_PACKAGES = ("ddlkit", "hydra-core", "omegaconf", "pluggy", "numpy")


@dataclass(frozen=True)
class PreparedJob:
    spec: JobSpec
    compute: ComputeTarget
    #: the job's config as job.json holds it: plain, every secret replaced by ``***``
    redacted_config: dict[str, Any]
    overrides: tuple[str, ...] = ()
    #: what composed the job besides its overrides (``--config-dir``, ``hydra.searchpath``, ...):
    #: see :func:`ddlkit.launch.commandline.launch_args`
    launch: tuple[str, ...] = ()

    @property
    def resume_hint(self) -> str:
        return f"resume with: {job_command(self.overrides, self.spec.job_dir, self.launch)}"


def environment_info(cfg: DictConfig, registry: Registry, pm: DdlkitPluginManager) -> dict[str, Any]:
    """What the launcher ran with: Python, the platform, the versions of the core's and the selected
    components' distributions (those installed here), the command line (redacted), the git state."""
    wanted = list(CORE_PACKAGES)
    for _, entry in registry.selected(cfg):
        plugin = pm.infos.get(id(entry.plugin))
        wanted += ([plugin.distribution] if plugin is not None else []) + list(entry.registration.packages)
    packages = {}
    for dist in dict.fromkeys(wanted):
        try:
            packages[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": packages,
        "argv": redact_overrides(sys.argv),
        "git": _git_state(),
    }


def _git_state() -> dict[str, Any] | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def job_name(job_dir: Path) -> str:
    """``outputs/2026-11-22/10-04-01`` -> ``2026-11-22_10-04-01-3fa2c1d9``: readable, and unique --
    the suffix hashes the absolute directory, so two job directories never share a name (results
    are published and ``ddlkit jobs`` finds jobs under it), while a re-run of the same directory
    (a resume) keeps its name."""
    job_dir = Path(job_dir).resolve()
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{job_dir.parent.name}_{job_dir.name}").strip("_") or "job"
    return f"{readable}-{hashlib.sha1(str(job_dir).encode()).hexdigest()[:8]}"


def job_environment(
    cfg: DictConfig, pm: DdlkitPluginManager, extra: Mapping[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """``(env, secret_env)`` for the ranks: the plugin switches from this environment, what
    plugins ask for (``ddlkit_job_environment``) and ``extra``; secret-looking names are secret."""
    merged = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    for part in pm.hook.ddlkit_job_environment(config=cfg):
        merged.update({str(k): str(v) for k, v in (part or {}).items()})
    merged.update(extra or {})
    env = {k: v for k, v in merged.items() if not is_secret_key(k)}
    return env, {k: v for k, v in merged.items() if k not in env}


def user_code(cfg: DictConfig, compute: ComputeTarget, job_dir: Path) -> tuple[dict[str, str], CodeSnapshot | None]:
    """How the ranks reach the code the config names in the launch directory (``model.target=my_pkg...``):
    ranks on the launcher's disk import it from there (``$DDLKIT_LAUNCH_DIR``, the environment
    returned); any other target gets a snapshot of the launch directory, returned to be written
    into the job directory. Neither when every import path names an installed package."""
    here = launch_dir()
    if not imports_from(here, import_paths(cfg)):
        return {}, None
    if compute.shares_job_dir:
        return {LAUNCH_DIR_ENV: str(here)}, None
    return {}, CodeSnapshot.take(
        here, max_bytes=int(cfg.code.max_mb * 1e6), exclude=list(cfg.code.exclude), skip=[job_dir]
    )


def _write_snapshot(job_dir: Path, snapshot: CodeSnapshot | None) -> None:
    if snapshot is not None:
        snapshot.write(job_dir)
    else:  # a job run again without user code must not import an earlier run's snapshot
        shutil.rmtree(job_dir / CODE_DIR, ignore_errors=True)
        (job_dir / CODE_FILE).unlink(missing_ok=True)


def prepare(
    cfg: DictConfig,
    *,
    job_dir: Path,
    overrides: Sequence[str],
    registry: Registry,
    pm: DdlkitPluginManager,
    env: Mapping[str, str] | None = None,
    compute: ComputeTarget | None = None,
    validated: dict[str, Any] | None = None,
    launch: Sequence[str] = (),
) -> PreparedJob:
    """Validate (unless ``validated`` holds the result already), build the compute target (unless
    given), and write the job directory. ``env``: more environment for the ranks; ``launch``: what
    composed the job besides its overrides, for the command that resumes it."""
    compute = compute or build_target(cfg, registry)
    container = validated if validated is not None else validate(cfg, registry, pm, compute=compute)
    # a secret given on the command line must not reach the job files (nor the resume hint) either
    overrides = redact_overrides(overrides)
    job_dir = Path(job_dir).resolve()
    if compute.shares_job_dir:
        # fail here, not after a queue: the ranks will see this same directory (the worker decides
        # for targets that run a copy of it, where the checkpoints may be only on the cluster's side,
        # and it is the worker that warns about a checkpoint it passes over: once, in the job's log)
        resolve_resume(job_dir, cfg.trainer.resume, warn=lambda message: None)
    refuse_a_running_job(job_dir, registry)
    name = job_name(job_dir)
    redacted, secrets = split_secrets(container)
    job_dir.mkdir(parents=True, exist_ok=True)
    # nothing in the job directory names the launcher's paths: it runs wherever it is copied
    write_json(
        job_dir / JOB_FILE,
        {"version": 2, "name": name, "config": redacted, "overrides": list(overrides), "secrets": sorted(secrets)},
    )
    write_text(job_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create(redacted)))
    write_text(job_dir / OVERRIDES_FILE, OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    write_json(job_dir / ENVIRONMENT_FILE, environment_info(cfg, registry, pm))
    code_env, snapshot = user_code(cfg, compute, job_dir)
    _write_snapshot(job_dir, snapshot)
    rank_env, secret_env = job_environment(cfg, pm, {**code_env, **(env or {})})
    if secrets:
        secret_env[SECRETS_ENV] = encode(secrets)
    spec = JobSpec(
        name=name,
        job_dir=job_dir,
        env=rank_env,
        secret_env=secret_env,
        code_digest=snapshot.digest if snapshot is not None else None,
    )
    return PreparedJob(spec, compute, redacted, tuple(overrides), tuple(redact_overrides(launch)))


def remove_empty_dirs(directory: Path) -> None:
    """Remove ``directory`` and then its parents while they are empty, up to the working directory:
    what Hydra made for a job that never started (``outputs/<date>/<time>``) is not left behind."""
    cwd = Path.cwd().resolve()
    here = Path(directory).resolve()
    while here != cwd:
        try:
            here.rmdir()
        except OSError:
            return
        if cwd not in here.parents:
            return
        here = here.parent


def refuse_a_running_job(job_dir: Path, registry: Registry) -> None:
    """A job directory has one writer: re-running a job whose previous run still runs (detached,
    or launched from another shell) would overwrite its files under it."""
    try:
        sub = index.load(job_dir)
    except ConfigError:
        return  # never submitted: nothing runs there
    if sub.ended is not None:
        return
    try:
        state = sub.handle(registry).status().state
    except DdlkitError:
        return  # its target cannot say (gone, or unreachable): the worker's lock still guards the directory
    if not state.done:
        raise ConfigError(
            f"job {sub.name} still runs in {job_dir} (compute={sub.target}, id {sub.id}): follow it "
            f"with `ddlkit jobs attach {sub.name}`, stop it with `ddlkit jobs cancel {sub.name}`, or "
            "choose another hydra.run.dir."
        )
