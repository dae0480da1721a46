"""The sweep launcher behind ``hydra/launcher=ddlkit`` (ddlkit's default for ``ddlkit -m``).

Design
------
One scheduler (:class:`~ddlkit.launch.sweep.scheduler.Scheduler`) keeps up to ``max_parallel`` jobs in
flight through ddlkit's asynchronous compute contract -- ``start() -> JobHandle``; then
``status``, ``logs``, ``cancel``, ``wait`` -- starts the next job as soon as one ends (not batch
by batch), and applies ``on_failure`` (keep-going, fail-fast, retry:N). What differs between
the two kinds of Hydra task is only where a job's handle comes from:

* **ddlkit's own task** (``ddlkit -m``): the CLI marks its task function with a
  :class:`~ddlkit.launch.sweep.sweep.DdlkitSweep`. Every job is composed and validated before any
  starts; each is then prepared exactly like a single run (``prepare.prepare`` writes its job
  directory) and submitted to *its compute target* -- a child process for ``compute=local``,
  an ``mpirun`` or a remote cluster for other targets, unchanged, since only the contract is
  used. A ledger makes the sweep resumable, and a report (CSV, Markdown, PNG) ends it.
* **any other Hydra task function** (Hydra's launcher conformance suites, a user's own app that
  selects ``hydra/launcher=ddlkit``): each job is Hydra's own ``run_job`` in a forked child
  process (:class:`~ddlkit.launch.sweep.forked.ForkedTaskHandle`), so it behaves as under Hydra's
  basic launcher -- output directories, logging, ``.hydra`` files, return values -- only with
  ``max_parallel`` jobs at once. Forking lets any task function run (closures included).

Either way the launcher composes every job in its own process, in order, before starting any
(a job that does not compose fails the launch), and returns Hydra's ``JobReturn`` for every
job, in job order; a failed job's return has status FAILED and carries its error, which Hydra's
basic sweeper raises once the whole batch has run.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.core.utils import JobStatus as TaskStatus

from ...errors import ConfigError
from . import SWEEP_ATTR, SweepOnDemand
from .compose import ComposedJob, compose_job
from .forked import ForkedTaskHandle
from .scheduler import Observer, Outcome, Scheduler, SweepJob
from .sweep import DdlkitSweep, SweepError

if TYPE_CHECKING:
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig

    from .optuna import Pruning
    from .settings import SweepSettings

log = logging.getLogger(__name__)


def launch(
    settings: SweepSettings,
    *,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    pruning: Pruning | None = None,
) -> list[JobReturn]:
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep = getattr(task_function, SWEEP_ATTR, None)
    if isinstance(sweep, SweepOnDemand):  # the CLI's task: its sweep is made now
        sweep = sweep()
    if isinstance(sweep, DdlkitSweep):
        return sweep.launch(
            settings,
            hydra_context=hydra_context,
            config=config,
            job_overrides=job_overrides,
            initial_job_idx=initial_job_idx,
            trials=pruning.batch(initial_job_idx) if pruning is not None else None,
            pruning=pruning,
        )
    return launch_tasks(
        settings,
        hydra_context=hydra_context,
        task_function=task_function,
        config=config,
        job_overrides=job_overrides,
        initial_job_idx=initial_job_idx,
    )


def launch_tasks(
    settings: SweepSettings,
    *,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> list[JobReturn]:
    """A plain Hydra app's jobs, each Hydra's ``run_job`` in a forked child, ``max_parallel`` at once."""
    try:
        policy = settings.policy("hydra.launcher")
    except ConfigError as err:
        raise SweepError(str(err)) from None
    if "fork" not in multiprocessing.get_all_start_methods():
        raise SweepError(
            "hydra/launcher=ddlkit runs a Hydra app's jobs in forked processes, which this platform "
            "does not have; use hydra/launcher=basic"
        )
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    jobs = [
        compose_job(hydra_context, config, overrides, initial_job_idx + i) for i, overrides in enumerate(job_overrides)
    ]
    log.info(f"Launching {len(jobs)} jobs, up to {settings.max_parallel} at once")
    for job in jobs:
        log.info(f"\t#{job.num} : {' '.join(filter_overrides(job.overrides))}")
    if settings.dry_run:
        return []

    def start(job: ComposedJob) -> ForkedTaskHandle:
        run = functools.partial(
            run_job,
            hydra_context=hydra_context,
            task_function=task_function,
            config=job.config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        return ForkedTaskHandle(run, name=f"job-{job.num}")

    scheduler = Scheduler(
        settings.max_parallel, policy, status_interval_s=settings.status_interval_s, observer=_LogFailures()
    )
    sweep = scheduler.run([SweepJob(j.num, " ".join(j.overrides), functools.partial(start, j)) for j in jobs])
    if sweep.interrupted:
        raise KeyboardInterrupt
    # each job's run_job configured logging for itself, in its child; the launcher's stays as it was
    return [_task_return(job, sweep.outcomes[job.num], sweep.stopped_by) for job in jobs]


def _task_return(job: ComposedJob, outcome: Outcome, stopped_by: int | None) -> JobReturn:
    handle = outcome.handle
    if isinstance(handle, ForkedTaskHandle) and handle.job_return is not None and outcome.state != "cancelled":
        return handle.job_return
    if outcome.state == "pending" and stopped_by is not None:
        why = f"not started: on_failure=fail-fast stopped the sweep after job #{stopped_by} failed"
    elif outcome.state == "cancelled":
        why = f"cancelled: on_failure=fail-fast stopped the sweep after job #{stopped_by} failed"
    else:
        why = f"{outcome.state}: {outcome.message}"
    ret = JobReturn(
        overrides=job.overrides,
        cfg=job.task_config(),
        hydra_cfg=job.hydra_config(),
        working_dir=str(job.output_dir),
        task_name=str(job.config.hydra.job.name),
    )
    ret.status, ret.return_value = TaskStatus.FAILED, SweepError(f"job #{job.num} ({' '.join(job.overrides)}) {why}")
    return ret


class _LogFailures(Observer):
    """Reports each failure as it happens (the task's own output already went to the terminal)."""

    def ended(self, job: SweepJob, outcome: Outcome, *, will_retry: bool) -> None:
        if outcome.state == "failed":
            log.error(f"#{job.num} : {job.label} failed: {outcome.message}" + (" (retrying)" if will_retry else ""))
