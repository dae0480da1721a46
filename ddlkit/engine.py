"""The launcher side of a job: validate -> write job files -> submit -> watch -> collect.

Hydra runs only here. What the ranks get is one resolved job file (secrets redacted) plus
the environment; :mod:`ddlkit.worker` trains from that file and never re-enters Hydra.
"""

from __future__ import annotations

import contextlib
import json
import platform
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from . import secrets as secret_store
from .atomic import write_json, write_text
from .checkpoint import resolve_resume
from .config import to_container
from .distributed import BACKENDS
from .errors import ConfigError, JobFailedError
from .interfaces import ComputeTarget, JobSpec, JobState
from .registry import HOOK_POINTS, Registry

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .plugins import DdlkitPluginManager

JOB_FILE = "job.json"
#: distributions whose versions are recorded in environment.json when installed
RECORDED_PACKAGES = ("ddlkit", "hydra-core", "omegaconf", "pluggy", "numpy", "torch", "tensorflow", "tensorflow-cpu",
                     "keras", "horovod", "mpi4py", "wandb", "azure-storage-blob", "azure-ai-ml")


@dataclass(frozen=True)
class PreparedJob:
    spec: JobSpec
    compute: ComputeTarget
    config: dict[str, Any]
    overrides: tuple[str, ...] = ()

    @property
    def resume_hint(self) -> str:
        kept = [o for o in self.overrides if not o.startswith("hydra.run.dir=")]
        return f"resume with: ddlkit {shlex.join(kept + [f'hydra.run.dir={self.spec.job_dir}'])}"


def _check(cond: bool, key: str, value: object, requirement: str) -> None:
    if not cond:
        raise ConfigError(f"{key}={value} is invalid: it must be {requirement}.")


def validate(cfg: DictConfig, registry: Registry, pm: DdlkitPluginManager) -> dict[str, Any]:
    """Check the composed config before anything runs; return it resolved as plain containers."""
    for group, hp in HOOK_POINTS.items():
        # `logger=[]` (no loggers) leaves the key out of the composed config altogether
        names = list(cfg.get(group) or {}) if hp.multi else [cfg[group].name]
        for name in names:
            registry.get(group, name)
    try:
        container = to_container(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key
        raise ConfigError(f"missing value for `{key}`: set it on the command line, e.g. {key}=<value>.") from None
    except OmegaConfBaseException as err:
        raise ConfigError(f"config error at `{getattr(err, 'full_key', '?')}`: {err.msg}") from None

    t, o = cfg.trainer, cfg.optimizer
    for key in ("epochs", "batch_size", "log_every", "keep_checkpoints"):
        _check(t[key] >= 1, f"trainer.{key}", t[key], "a positive integer")
    _check(t.warmup_steps >= 0, "trainer.warmup_steps", t.warmup_steps, ">= 0")
    _check(t.checkpoint_every >= 0, "trainer.checkpoint_every", t.checkpoint_every, ">= 0 (0 = per epoch)")
    _check(t.max_steps is None or t.max_steps >= 1, "trainer.max_steps", t.max_steps, "null or a positive integer")
    _check(o.lr > 0, "optimizer.lr", o.lr, "positive")
    _check(0 <= o.momentum < 1, "optimizer.momentum", o.momentum, "in [0, 1)")
    _check(o.weight_decay >= 0, "optimizer.weight_decay", o.weight_decay, ">= 0")
    _check(o.warmup_epochs >= 0, "optimizer.warmup_epochs", o.warmup_epochs, ">= 0")
    _check(0 <= o.label_smoothing < 1, "optimizer.label_smoothing", o.label_smoothing, "in [0, 1)")
    _check(o.name == "sgd", "optimizer.name", o.name, "sgd (the only optimizer so far)")
    _check_distributed(cfg, registry)

    framework_cls = registry.get("framework", cfg.framework.name).factory
    models = getattr(framework_cls, "models", ())
    if models and cfg.model.name not in models:
        raise ConfigError(f"framework={cfg.framework.name} cannot build model={cfg.model.name}. "
                          f"Choose one of: {', '.join(models)}.")
    data_cls = registry.get("data", cfg.data.name).factory
    supported = getattr(data_cls, "frameworks", ())
    data_format = getattr(framework_cls, "data_format", None) or cfg.framework.name
    if supported and data_format not in supported:
        raise ConfigError(f"data={cfg.data.name} has no input pipeline for framework={cfg.framework.name}; "
                          f"it supports: {', '.join(supported)}.")
    # Framework.configure is the framework's own launcher-side check (documented on the interface)
    registry.create("framework", cfg.framework.name, cfg.framework).configure(cfg)
    pm.hook.ddlkit_configure(config=cfg)
    return container


def _check_distributed(cfg: DictConfig, registry: Registry) -> None:
    """The dist settings against the compute target's number of ranks."""
    d = cfg.dist
    _check(d.backend in BACKENDS, "dist.backend", d.backend, f"one of: {', '.join(BACKENDS)}")
    _check(d.timeout_s > 0, "dist.timeout_s", d.timeout_s, "positive")
    _check(d.stop_check_every >= 1, "dist.stop_check_every", d.stop_check_every, "a positive integer")
    world_size = registry.create("compute", cfg.compute.name, cfg.compute).world_size
    if world_size > 1 and d.backend == "none":
        raise ConfigError(f"compute={cfg.compute.name} runs {world_size} ranks, which must share their gradients: "
                          "add dist=native (the framework's own collectives) or dist=horovod.")
    # the ranks repeat this check once their data is readable; a data source whose config states
    # its length (data=synthetic) is checked here, before anything starts
    length = cfg.data.get("length")
    global_batch = cfg.trainer.batch_size * world_size
    if isinstance(length, int) and length < global_batch:
        raise ConfigError(f"data has {length} training images, fewer than one global batch of {global_batch} "
                          f"(trainer.batch_size={cfg.trainer.batch_size} x {world_size} ranks). Lower "
                          "trainer.batch_size or raise data.length.")


def environment_info() -> dict[str, Any]:
    packages = {}
    for dist in RECORDED_PACKAGES:
        try:
            packages[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": packages,
            "argv": secret_store.redact_overrides(sys.argv), "git": _git_state()}


def _git_state() -> dict[str, Any] | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def prepare(cfg: DictConfig, *, job_dir: Path, job_name: str, overrides: Sequence[str], registry: Registry,
            pm: DdlkitPluginManager) -> PreparedJob:
    """Validate, write the job directory's files, and build the compute target."""
    container = validate(cfg, registry, pm)
    # a secret given on the command line must not reach the job files (nor the resume hint) either
    overrides = secret_store.redact_overrides(overrides)
    job_dir = Path(job_dir).resolve()
    resolve_resume(job_dir, cfg.trainer.resume)  # a bad resume setting fails here, not on the cluster
    redacted, secrets = secret_store.split_secrets(container)
    job_dir.mkdir(parents=True, exist_ok=True)
    job_file = job_dir / JOB_FILE
    write_json(job_file, {"version": 1, "name": job_name, "job_dir": str(job_dir), "config": redacted,
                          "overrides": list(overrides), "secrets": sorted(secrets)})
    write_text(job_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(redacted)))
    write_text(job_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    write_json(job_dir / "environment.json", environment_info())
    compute = registry.create("compute", cfg.compute.name, cfg.compute)
    env = {secret_store.SECRETS_ENV: secret_store.encode(secrets)} if secrets else {}
    spec = JobSpec(name=job_name, job_dir=job_dir, job_file=job_file,
                   argv=[sys.executable, "-m", "ddlkit.worker", str(job_file)], env=env)
    return PreparedJob(spec, compute, redacted, tuple(overrides))


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """A SIGTERM to ddlkit (a batch scheduler's preemption, ``kill``) stops the job as Ctrl-C
    does: the job checkpoints and stops, instead of running on without its launcher. Signal
    handlers belong to the main thread; elsewhere (a sweep's job threads) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_job(job: PreparedJob, *, out: TextIO | None = None, live: bool | None = None) -> dict[str, Any]:
    """Submit, stream rank 0's output, and return result.json; raise JobFailedError otherwise."""
    out = out or sys.stdout
    live = out.isatty() if live is None else live
    spec = job.spec
    out.write(f"ddlkit: job {spec.name} -> {spec.job_dir}\n")
    out.flush()
    handle = job.compute.submit(spec)
    with _sigterm_interrupts():
        try:
            if live and "console" in job.config.get("logger", {}):
                from .builtin.console_logger import ProgressRenderer

                with ProgressRenderer(out) as renderer:
                    for chunk in handle.logs(follow=True):
                        renderer.feed(chunk)
            else:
                for chunk in handle.logs(follow=True):
                    out.write(chunk)
                    out.flush()
            status = handle.wait()
        except KeyboardInterrupt:
            out.write("\nddlkit: interrupted; asking the job to checkpoint and stop...\n")
            handle.cancel()
            for chunk in handle.logs(follow=True):
                out.write(chunk)
            status = handle.wait()
    if status.state is JobState.SUCCEEDED:
        result_path = spec.job_dir / "result.json"
        if not result_path.is_file():
            raise JobFailedError(f"job {spec.name} exited cleanly but wrote no {result_path}")
        result = json.loads(result_path.read_text())
        out.write(f"ddlkit: done; result in {result_path}\n")
        return result
    from .run import EXIT_PREEMPTED

    if status.exit_code == EXIT_PREEMPTED:
        raise JobFailedError(f"job {spec.name} stopped after saving a checkpoint; {job.resume_hint}",
                             exit_code=EXIT_PREEMPTED)
    raise JobFailedError(f"job {spec.name} {status.state.value}: {status.message}\n  {job.resume_hint}",
                         exit_code=status.exit_code if status.exit_code and status.exit_code > 0 else 1)
