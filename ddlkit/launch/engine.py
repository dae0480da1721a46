"""The launcher side of a job: validate -> write the job directory -> submit -> follow -> collect.

Hydra runs only here. What the ranks get is the job directory -- one resolved job file (secrets
redacted) that names no path of the launcher's -- plus the environment the job spec carries;
:mod:`ddlkit.rank.worker` trains from that file, wherever the directory is, and never re-enters Hydra.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from .. import callbacks, monitor, options
from .. import redact as secret_store
from ..atomic import write_json, write_text
from ..checkpoint import latest_checkpoint, resolve_resume
from ..config import check_one_global_batch, to_container
from ..errors import ConfigError, DdlkitError, JobFailedError
from ..interfaces import ComputeTarget, JobHandle, JobSpec, JobState, JobStatus
from ..jobdir import (CONFIG_FILE, ENVIRONMENT_FILE, EXIT_CONFIG_ERROR, EXIT_PREEMPTED, JOB_FILE, OVERRIDES_FILE,
                      RESULT_FILE)
from ..registry import HOOK_POINTS, Registry
from .commandline import job_command
from .hydra_errors import check_composed
from .jobs import index

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..plugins import DdlkitPluginManager

#: what the launcher passes on to the ranks from its own environment: which plugins to load
FORWARDED_ENV = ("DDLKIT_PLUGINS", "DDLKIT_DISABLE_PLUGINS", "DDLKIT_DISABLE_PLUGIN_AUTOLOAD", "DDLKIT_TRACE_PLUGINS")
#: distributions whose versions are recorded in environment.json when installed
RECORDED_PACKAGES = ("ddlkit", "hydra-core", "omegaconf", "pluggy", "numpy", "torch", "tensorflow", "tensorflow-cpu",
                     "keras", "horovod", "mpi4py", "wandb", "azure-storage-blob", "azure-ai-ml")


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


def build_target(cfg: DictConfig, registry: Registry) -> ComputeTarget:
    """The job's compute target: built once per job, from ``cfg.compute``."""
    check_composed(cfg, registry)  # a preset's node gets its plugin's schema before it is read
    return registry.create("compute", cfg.compute.name, cfg.compute)


def validate(cfg: DictConfig, registry: Registry, pm: DdlkitPluginManager, *,
             compute: ComputeTarget | None = None) -> dict[str, Any]:
    """Check the composed config before anything runs; return it resolved as plain containers.
    ``compute``: the job's target, when the caller has built it already."""
    check_composed(cfg, registry)
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

    # every option's own constraint, declared on its schema's field (ddlkit.options)
    options.check(cfg)
    monitor.check(cfg)
    callbacks.resolve(cfg.trainer.callbacks)
    compute = compute or build_target(cfg, registry)
    _check_distributed(cfg, compute, registry)
    # the selected framework must implement the selected model and optimizer
    for group in ("model", "optimizer"):
        registry.get_for(group, cfg.framework.name, cfg[group].name)
    for component in _selected(cfg, registry, compute):
        component.configure(cfg)
    # what no one component owns: checks across the config (user code importable, ...)
    pm.hook.ddlkit_configure(config=cfg)
    return container


def _selected(cfg: DictConfig, registry: Registry, compute: ComputeTarget) -> Iterator[Any]:
    """The selected components, built as the ranks will build them, each to check its own options
    (``configure``); models and optimizers are the framework's to check."""
    for group, hp in HOOK_POINTS.items():
        if hp.per_framework:
            continue
        if group == "compute":
            yield compute
            continue
        nodes = (cfg.get(group) or {}).values() if hp.multi else [cfg[group]]
        for node in nodes:
            yield registry.create(group, node.name, node)


def _check_distributed(cfg: DictConfig, compute: ComputeTarget, registry: Registry) -> None:
    """The dist settings and the data against the compute target's number of ranks."""
    world_size = compute.world_size
    if world_size > 1 and cfg.dist.backend == "none":
        raise ConfigError(f"compute={cfg.compute.name} runs {world_size} ranks, which must share their gradients: "
                          "add dist=native (the framework's own collectives) or dist=horovod.")
    # every rank checks the data against the global batch once the data is readable; a source
    # whose config states its size is checked here as well, before anything starts
    stated = registry.create("data", cfg.data.name, cfg.data).config_info()
    if stated is not None:
        check_one_global_batch(stated.train_length, cfg.trainer, world_size)


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


def job_name(job_dir: Path) -> str:
    """``outputs/2026-11-22/10-04-01`` -> ``2026-11-22_10-04-01-3fa2c1d9``: readable, and unique --
    the suffix hashes the absolute directory, so two job directories never share a name (results
    are published and ``ddlkit jobs`` finds jobs under it), while a re-run of the same directory
    (a resume) keeps its name."""
    job_dir = Path(job_dir).resolve()
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{job_dir.parent.name}_{job_dir.name}").strip("_") or "job"
    return f"{readable}-{hashlib.sha1(str(job_dir).encode()).hexdigest()[:8]}"


def job_environment(cfg: DictConfig, pm: DdlkitPluginManager,
                    extra: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(env, secret_env)`` for the ranks: the plugin switches from this environment, what
    plugins ask for (``ddlkit_job_environment``) and ``extra``; secret-looking names are secret."""
    merged = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    for part in pm.hook.ddlkit_job_environment(config=cfg):
        merged.update({str(k): str(v) for k, v in (part or {}).items()})
    merged.update(extra or {})
    env = {k: v for k, v in merged.items() if not secret_store.is_secret_key(k)}
    return env, {k: v for k, v in merged.items() if k not in env}


def prepare(cfg: DictConfig, *, job_dir: Path, overrides: Sequence[str], registry: Registry,
            pm: DdlkitPluginManager, env: Mapping[str, str] | None = None, compute: ComputeTarget | None = None,
            validated: dict[str, Any] | None = None, launch: Sequence[str] = ()) -> PreparedJob:
    """Validate (unless ``validated`` holds the result already), build the compute target (unless
    given), and write the job directory. ``env``: more environment for the ranks; ``launch``: what
    composed the job besides its overrides, for the command that resumes it."""
    compute = compute or build_target(cfg, registry)
    container = validated if validated is not None else validate(cfg, registry, pm, compute=compute)
    # a secret given on the command line must not reach the job files (nor the resume hint) either
    overrides = secret_store.redact_overrides(overrides)
    job_dir = Path(job_dir).resolve()
    if compute.shares_job_dir:
        # fail here, not after a queue: the ranks will see this same directory (the worker decides
        # for targets that run a copy of it, where the checkpoints may be only on the cluster's side,
        # and it is the worker that warns about a checkpoint it passes over: once, in the job's log)
        resolve_resume(job_dir, cfg.trainer.resume, warn=lambda message: None)
    refuse_a_running_job(job_dir, registry)
    name = job_name(job_dir)
    redacted, secrets = secret_store.split_secrets(container)
    job_dir.mkdir(parents=True, exist_ok=True)
    # nothing in the job directory names the launcher's paths: it runs wherever it is copied
    write_json(job_dir / JOB_FILE, {"version": 2, "name": name, "config": redacted, "overrides": list(overrides),
                                    "secrets": sorted(secrets)})
    write_text(job_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create(redacted)))
    write_text(job_dir / OVERRIDES_FILE, OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    write_json(job_dir / ENVIRONMENT_FILE, environment_info())
    rank_env, secret_env = job_environment(cfg, pm, env)
    if secrets:
        secret_env[secret_store.SECRETS_ENV] = secret_store.encode(secrets)
    spec = JobSpec(name=name, job_dir=job_dir, env=rank_env, secret_env=secret_env)
    return PreparedJob(spec, compute, redacted, tuple(overrides), tuple(secret_store.redact_overrides(launch)))


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
        raise ConfigError(f"job {sub.name} still runs in {job_dir} (compute={sub.target}, id {sub.id}): follow it "
                          f"with `ddlkit jobs attach {sub.name}`, stop it with `ddlkit jobs cancel {sub.name}`, or "
                          "choose another hydra.run.dir.")


def submit(job: PreparedJob, *, detach: bool = False) -> JobHandle:
    """Submit the job and record it, so that ``ddlkit jobs`` finds it from any shell."""
    handle = job.compute.submit(job.spec)
    if detach:
        handle.detach()
    index.record(job.spec.name, job.spec.job_dir, str(job.redacted_config["compute"]["name"]), handle.id, detached=detach)
    return handle


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """A SIGTERM to ddlkit (a batch scheduler's preemption, ``kill``) stops a job or a sweep as
    Ctrl-C does: the jobs checkpoint and stop, instead of running on without their launcher.
    Signal handlers belong to the main thread; elsewhere nothing changes."""
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


#: seconds of silence after which :func:`follow` says what a job without output is doing, and
#: between its looks at the job's state until the first output comes
NOTICE_AFTER_S = 3.0


class _StateNotices:
    """Until a job's first output: its state and what its target says of it (a scheduler's reason
    for keeping it queued), once it has been silent for :data:`NOTICE_AFTER_S`, then on each change.
    A job that waits in a queue, or takes long to start, is never silent."""

    def __init__(self, handle: JobHandle, out: TextIO) -> None:
        self.handle, self.out = handle, out
        self.lock = threading.Lock()
        self.output = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ddlkit-job-state", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        said = None
        while not self.output.wait(NOTICE_AFTER_S):
            try:
                status = self.handle.status()
            except Exception:  # noqa: BLE001 -- the stream asks too, and reports what is wrong
                return
            if status.state.done:
                return
            notice = (f"ddlkit: job {status.state.value}" + (f" ({status.message})" if status.message else "")
                      + ", no output yet")
            with self.lock:
                if notice != said and not self.output.is_set():
                    self.out.write(notice + "\n")
                    self.out.flush()
                    said = notice

    def stop(self) -> None:
        """The job's output has come (or the job ended): no more notices."""
        with self.lock:  # a notice is never written into the job's output
            self.output.set()


def _stream(handle: JobHandle, out: TextIO, progress_bar: bool) -> None:
    chunks = iter(handle.logs(follow=True))
    notices = _StateNotices(handle, out)
    try:
        first = next(chunks, None)
    finally:
        notices.stop()
    if first is None:
        return
    if progress_bar:
        from ..builtin.console_logger import ProgressRenderer

        with ProgressRenderer(out) as renderer:
            for chunk in itertools.chain([first], chunks):
                renderer.feed(chunk)
    else:
        for chunk in itertools.chain([first], chunks):
            out.write(chunk)
            out.flush()


def follow(handle: JobHandle, *, out: TextIO, progress_bar: bool, on_interrupt: str = "cancel") -> JobStatus | None:
    """Stream the job's output until it ends and return its status. Ctrl-C (or SIGTERM) either
    cancels the job -- it checkpoints, and its last output is shown -- or, with
    ``on_interrupt="detach"``, leaves it running and returns None."""
    with sigterm_interrupts():
        try:
            _stream(handle, out, progress_bar)
            return handle.wait()
        except KeyboardInterrupt:
            if on_interrupt == "detach":
                handle.detach()
                return None
            out.write("\nddlkit: interrupted; asking the job to checkpoint and stop...\n")
            handle.cancel()
            for chunk in handle.logs(follow=True):
                out.write(chunk)
            return handle.wait()


def settle(handle: JobHandle, status: JobStatus, job_dir: Path) -> JobStatus:
    """Once a job has ended: bring its files back, record its end, and apply ddlkit's rule for
    an end -- a job that exited cleanly but wrote no ``result.json`` has failed."""
    handle.collect()
    result_path = Path(job_dir) / RESULT_FILE
    if status.state is JobState.SUCCEEDED and not result_path.is_file():
        status = JobStatus(JobState.FAILED, status.exit_code, f"the job exited cleanly but wrote no {result_path}")
    with contextlib.suppress(DdlkitError):  # a job directory without a record still has a result
        index.load(job_dir).ended_with(status)
    return status


def resumable(status: JobStatus, job_dir: Path) -> bool:
    """Whether the job's command, run again, resumes the ended job: its ranks stopped when told to
    (``EXIT_PREEMPTED``, while running), or it left a checkpoint. A job that failed before training,
    or was cancelled before it started, has nothing to resume: its message names the cause instead."""
    return status.exit_code == EXIT_PREEMPTED or latest_checkpoint(job_dir) is not None


def conclude(handle: JobHandle, status: JobStatus, *, job_dir: Path, name: str,
             resume_hint: str, out: TextIO) -> dict[str, Any]:
    """After the job ended: :func:`settle` it, and return ``result.json`` (or raise
    :class:`JobFailedError` with what went wrong and how to resume)."""
    status = settle(handle, status, job_dir)
    if status.state is JobState.SUCCEEDED:
        result_path = Path(job_dir) / RESULT_FILE
        result = json.loads(result_path.read_text())
        out.write(f"ddlkit: done; result in {result_path}\n")
        return result
    if status.exit_code == EXIT_PREEMPTED:
        saved = "after saving a checkpoint" if latest_checkpoint(job_dir) is not None else "before its first checkpoint"
        raise JobFailedError(f"job {name} stopped {saved}; {resume_hint}", exit_code=EXIT_PREEMPTED)
    # a rank's config error (a model.target that does not import, a model of the wrong kind) is
    # fixed in the command, so the same command would only fail again
    resume = resumable(status, job_dir) and status.exit_code != EXIT_CONFIG_ERROR
    hint = f"\n  {resume_hint}" if resume else ""
    raise JobFailedError(f"job {name} {status.state.value}: {status.message}{hint}",
                         exit_code=status.exit_code if status.exit_code and status.exit_code > 0 else 1)


def run_job(job: PreparedJob, *, out: TextIO | None = None, live: bool | None = None,
            detach: bool = False) -> dict[str, Any] | None:
    """Submit, stream rank 0's output, and return result.json; raise JobFailedError otherwise.
    With ``detach``: submit, say how to find the job again, and return None at once."""
    out = out or sys.stdout
    live = out.isatty() if live is None else live
    spec = job.spec
    out.write(f"ddlkit: job {spec.name} -> {spec.job_dir}\n")
    out.flush()
    handle = submit(job, detach=detach)
    if detach:
        out.write(f"ddlkit: detached; job {spec.name} runs on compute={job.redacted_config['compute']['name']} as "
                  f"{handle.id}.\n  follow it: ddlkit jobs attach {spec.name}\n"
                  f"  or: ddlkit jobs status|logs|cancel {spec.name}\n")
        out.flush()
        return None
    status = follow(handle, out=out, progress_bar=live and "console" in job.redacted_config.get("logger", {}))
    assert status is not None
    return conclude(handle, status, job_dir=spec.job_dir, name=spec.name, resume_hint=job.resume_hint, out=out)
