"""``ddlkit -m``: the sweep of ddlkit training jobs, run by the ddlkit launcher.

The CLI attaches a :class:`DdlkitSweep` to its task function (attribute :data:`~ddlkit.launch.sweep.SWEEP_ATTR`);
the launcher (:mod:`ddlkit.launch.sweep.launch`) finds it there and hands it the sweep's jobs instead
of calling the task function once per job. Then:

1. every job is composed and validated (``validate.validate``) before any starts: one bad value
   in any job is reported, with the job, and nothing runs (exit status 2);
2. the ledger (:mod:`.ledger`) is opened: a re-run of the same sweep skips completed jobs;
3. the scheduler (:mod:`.scheduler`) prepares each job (``prepare.prepare``: its job directory,
   as for a single run) and submits it to the job's compute target as a slot frees up, with
   ``DDLKIT_SWEEP_NAME``/``DDLKIT_SWEEP_JOB`` in its environment (loggers group runs by them),
   and looks at it at the target's own pace (``ComputeTarget.status_interval_s``). The ledger
   keeps each job's handle id: a re-run of the sweep re-attaches to jobs that still run
   instead of submitting them twice;
4. starts and ends are printed as they happen, failures with their error and log;
5. the report (:mod:`.report`) is written, and the exit status set (:mod:`ddlkit.jobdir`):
   ``EXIT_COMPLETED`` all completed, ``EXIT_FAILED`` a job failed, ``EXIT_PREEMPTED`` interrupted
   (resumable).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from hydra.core.utils import JobReturn
from hydra.core.utils import JobStatus as TaskStatus
from hydra.errors import CompactHydraException, HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ...atomic import LockHeld, hold_lock
from ...errors import ConfigError, DdlkitError, exit_code_for
from ...interfaces import ComputeTarget, JobHandle, JobSpec, JobState
from ...jobdir import EXIT_PREEMPTED, RESULT_FILE, SWEEP_JOB_ENV, SWEEP_NAME_ENV, rank_log
from ...redact import redact_config_file, redact_overrides
from ...result import HEADLINE
from .. import controller, follow, index, prepare, validate
from ..commandline import job_command, launch_args, override
from ..controller import JobController, Restarts
from ..hydra_errors import explain
from .compose import compose_job, hydra_config_of, job_view
from .halving import FINAL, PROMOTED, EarlyStopping, Ladder, Segment, budget_of, check_job, last_value
from .ledger import LEDGER_FILE, JobRecord, Ledger, result_summary
from .report import LiveReport, Report, compute_trained, varying_overrides
from .scheduler import Observer, Outcome, Scheduler, SweepJob
from .settings import FailurePolicy, SweepSettings

#: how many of a code snapshot's files ``ddlkit plan`` names
_PLANNED_FILES = 8

if TYPE_CHECKING:
    from hydra.types import HydraContext
    from omegaconf import DictConfig

    from ...compute.snapshot import CodeSnapshot
    from ...plugins import DdlkitPluginManager
    from ...registry import Registry
    from .optuna import Pruning

#: where a job's rank 0 output is, once the target has brought the job's files back
RANK0_LOG = rank_log(0)
#: the lock that gives a sweep directory one launcher (see hold_sweep_directory)
SWEEP_LOCK = ".sweep.lock"


class SweepError(CompactHydraException):
    """A job's failure, in the JobReturn Hydra gets: its sweeper prints the message (no traceback)."""


def sweep_name(sweep_dir: Path) -> str:
    """``multirun/2026-11-22/10-04-01`` -> ``2026-11-22_10-04-01``, as single jobs are named."""
    return f"{sweep_dir.parent.name}_{sweep_dir.name}".replace(" ", "_")


@dataclass(frozen=True)
class CheckedJob:
    """What a sweep keeps of a job it has composed and validated: its config is composed again
    when the job starts, so that a sweep of thousands of jobs holds no config per job."""

    num: int
    #: the job's task overrides, as the sweeper expanded them
    overrides: list[str]
    output_dir: Path
    #: its compute target's pace (``ComputeTarget.status_interval_s``) and name
    status_interval_s: float
    compute: str
    #: ``ddlkit plan`` only: the job's lines after its label and state
    plan: str = ""
    #: under sweep.early_stopping: the job's full budget (epochs or steps)
    budget: int | None = None


class DdlkitSweep:
    def __init__(self, registry: Registry, pm: DdlkitPluginManager, *, out: TextIO | None = None) -> None:
        self.registry, self.pm = registry, pm
        self.out = out or sys.stdout
        #: jobs an earlier run of this sweep left running, re-attached to instead of submitted again
        self.adopted: set[int] = set()
        #: the exit status ``ddlkit -m`` ends with; None until the launcher has run
        self.exit_code: int | None = None
        #: the sweep directory's lock, held from the first launch (a sweeper's first batch) to the exit
        self._writer: TextIO | None = None
        #: when the first batch started; a search sweeper's batches make one sweep, told once (see finish)
        self._started: float | None = None
        #: a search sweeper's latest (ledger, report, objective): what finish() reports
        self._search: tuple[Ledger, Report, str | None] | None = None
        #: sweep.early_stopping's rule; None: every job runs to its end
        self.stopping: EarlyStopping | None = None

    # ---------------------------------------------------------------- entry point (the launcher's)
    def launch(
        self,
        settings: SweepSettings,
        *,
        hydra_context: HydraContext,
        config: DictConfig,
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
        trials: dict[int, Any] | None = None,
        pruning: Pruning | None = None,
    ) -> list[JobReturn]:
        """Run one batch of the sweep (all of a grid; a search sweeper's batch). With
        hydra/sweeper=optuna_pruning: ``trials``, the batch's Optuna trials by job number, and
        ``pruning``, what the sweeper shares with the launcher (:mod:`.optuna`)."""
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        # Hydra's sweeper has just written the composed config and the command line, secrets included
        redact_config_file(sweep_dir / "multirun.yaml")
        had_ledger = (sweep_dir / LEDGER_FILE).is_file()
        sweeper = str(config.hydra.runtime.choices.get("hydra/sweeper", "basic"))
        launch = launch_args(config.hydra)
        try:
            policy = settings.policy("sweep")
            objective = settings.objective_for(config.hydra.get("sweeper"), sweeper)
            options = settings.stopping_options(sweeper)
            jobs = self._check_all(
                hydra_context, config, job_overrides, initial_job_idx, settings.dry_run, launch, options
            )
            stopping = self.stopping = _early_stopping(options, jobs)
            if stopping is not None and stopping.rule == "optuna":
                _check_study_direction(stopping, config.hydra.sweeper)
            if not settings.dry_run and self._writer is None:  # a plan writes nothing
                self._writer = hold_sweep_directory(sweep_dir)
            ledger = Ledger.open(sweep_dir, sweep_name(sweep_dir))
            done = set(ledger.reconcile((j.num, self._overrides(j), str(j.output_dir)) for j in jobs))
            if settings.dry_run:
                self._print_plan(jobs, ledger, done, settings, policy, stopping)
                self._set_exit(0)
                if sweeper != "basic":
                    # a search sweeper chooses each batch from the results of the ones before: it cannot be planned on
                    self.say(
                        f"ddlkit plan: hydra/sweeper={sweeper} chooses the values of each batch of trials from "
                        f"the results before it; these are its first {len(jobs)}."
                    )
                    raise SystemExit(0)
                return []
        except DdlkitError as err:
            self._end(exit_code_for(err), f"ddlkit: error: {err}")
        finally:
            if settings.dry_run and not had_ledger:
                _remove_plan_leftovers(sweep_dir)
        ledger.command = self._resume_command(sweep_dir)
        if stopping is not None:
            ledger.early_stopping = dataclasses.asdict(stopping)
        ledger.save()
        labels = varying_overrides(list(ledger.jobs.values()))
        computes = sorted({j.compute for j in jobs})
        where = (
            f"{sweep_dir} (up to {settings.max_parallel} at once on compute={','.join(computes)}, "
            f"on_failure={policy})" + (f"; {len(done)} completed before, skipped" if done else "")
        )
        if sweeper == "basic":
            self.say(f"ddlkit: sweep of {_jobs(len(jobs))} -> {where}")
            if stopping is not None:
                self.say(f"ddlkit: early stopping: {stopping.describe()}")
        elif self._started is None:  # a search: its batches, chosen one after another, make one sweep
            self.say(f"ddlkit: sweep by hydra/sweeper={sweeper}, in batches of {len(jobs)} -> {where}")
        self._started = self._started or time.perf_counter()
        live_report = LiveReport(settings.sort_by)
        start = functools.partial(self._submit, hydra_context, config, ledger, launch)
        by_num = {j.num: j for j in jobs}
        segments: dict[int, Segment] = {}  # early stopping: the segment each trial runs next, or last ran

        def sweep_job(num: int, segment: Segment | None = None) -> SweepJob:
            job = by_num[num]
            if segment is not None:
                segments[num] = segment
            return SweepJob(
                num,
                labels[num],
                functools.partial(start, job, segment),
                status_interval_s=job.status_interval_s,
                continues=segment is not None and segment.start > 0,
            )

        ladder = None
        if stopping is None:
            todo = [sweep_job(j.num) for j in jobs if j.num not in done]
        else:
            ladder = _ladder(stopping, [j.num for j in jobs], ledger, trials, pruning)
            runs = ladder.begin(by_num, {n: r.status for n, r in ledger.jobs.items()})
            for num, segment in runs:  # promotions owed since the sweep last ran: recorded before they run
                if segment.start > 0:
                    ledger.update(num, status=PROMOTED, target=segment.to)
            todo = [sweep_job(num, segment) for num, segment in runs]
        progress = _Progress(self, ledger, labels, policy, live_report, ladder, sweep_job, segments)
        scheduler = Scheduler(
            settings.max_parallel, policy, status_interval_s=settings.status_interval_s, observer=progress
        )
        # SIGTERM (a scheduler stopping the launcher, `kill`) interrupts the sweep as Ctrl-C does
        with follow.sigterm_interrupts():
            sweep = scheduler.run(todo)
        ledger.save()
        report = live_report.close(ledger)
        if sweeper == "basic" or sweep.interrupted:
            self._print_summary(ledger, report, [j.num for j in jobs], stopping)
        else:
            self._search = (ledger, report, objective)
        if sweep.interrupted:
            self._end(
                EXIT_PREEMPTED,
                "ddlkit: sweep interrupted; its running jobs checkpointed and stopped.\n"
                f"  resume with: {shlex.join(ledger.command)}",
            )
        failures = {
            j.num: self._failure(ledger.jobs[j.num], sweep.stopped_by, ledger, report.markdown)
            for j in jobs
            if ledger.jobs[j.num].status not in FINAL
        }
        # a search sweeper is told of failed trials and decides itself whether the search goes on
        self._set_exit(1 if failures and sweeper == "basic" else 0)
        task_name = str(config.hydra.job.name)
        return [self._job_return(j, ledger.jobs[j.num], failures.get(j.num), objective, task_name) for j in jobs]

    # ---------------------------------------------------------------- before anything runs
    def _check_all(
        self,
        hydra_context: HydraContext,
        config: DictConfig,
        job_overrides: Sequence[Sequence[str]],
        first: int,
        plan: bool,
        launch: list[str],
        stopping: Any = None,
    ) -> list[CheckedJob]:
        """Compose and validate every job (each config read and dropped at once); with ``plan``,
        keep what ``ddlkit plan`` prints of each; with ``stopping`` (``sweep.early_stopping``), check
        what it needs of each job and keep its budget."""
        check_sweep_settings_fixed(job_overrides)
        jobs, errors, said = [], [], set()
        for i, overrides in enumerate(job_overrides):
            num, label = first + i, " ".join(redact_overrides(overrides)) or "-"
            try:
                with job_view(hydra_context, config, overrides, num) as (cfg, output_dir):
                    target = validate.build_target(cfg, self.registry)
                    validate.validate(cfg, self.registry, self.pm, compute=target)
                    text = self._plan_lines(cfg, target, list(overrides), output_dir, launch) if plan else ""
                    if stopping is not None:
                        check_job(stopping, cfg)
                    jobs.append(
                        CheckedJob(
                            num,
                            list(overrides),
                            output_dir,
                            target.status_interval_s,
                            str(cfg.compute.name),
                            text,
                            budget_of(stopping, cfg) if stopping is not None else None,
                        )
                    )
            except DdlkitError as err:
                errors.append(f"job #{num} ({label}): {err}")
                said.add(str(err))
                single = err
            except (HydraException, OmegaConfBaseException) as err:  # Hydra could not compose it: a bad type, ...
                explained = explain(err)
                errors.append(f"job #{num} ({label}): {explained if explained is not None else err}")
                single = explained or ConfigError(str(err))
                said.add(str(single))
        # a sweep of one job, or the same error in every job (a sweep-wide setting): one line, as a single run
        if errors and (len(job_overrides) == 1 or (len(errors) == len(job_overrides) and len(said) == 1)):
            raise single
        if errors:
            noun = "job is" if len(errors) == 1 else "jobs are"
            raise ConfigError(
                f"{len(errors)} of {len(job_overrides)} sweep {noun} invalid; no job was started:\n  "
                + "\n  ".join(errors)
            )
        return jobs

    def _end(self, code: int, message: str) -> NoReturn:
        """End ``ddlkit -m`` now, with ``message`` and exit status ``code``: before any job ran (a bad
        job: nothing for a sweeper to learn from) or when the user interrupted the sweep. SystemExit
        passes through Hydra without a traceback or hint; the CLI returns :attr:`exit_code`."""
        print(message, file=sys.stderr, flush=True)
        self._set_exit(code)
        raise SystemExit(code)

    def _set_exit(self, code: int) -> None:
        # several launches (the sweeper's batches) make one sweep: the first failure's status stands
        if not self.exit_code:
            self.exit_code = code

    @staticmethod
    def _overrides(job: CheckedJob) -> list[str]:
        return redact_overrides(job.overrides)

    # ---------------------------------------------------------------- running
    def _submit(
        self,
        hydra_context: HydraContext,
        config: DictConfig,
        ledger: Ledger,
        launch: list[str],
        job: CheckedJob,
        segment: Segment | None = None,
    ) -> JobHandle:
        """Prepare and submit ``job``; under early stopping, its ``segment``: the same job with the
        segment's budget, resumed from its checkpoint where an earlier segment left off."""
        overrides = job.overrides
        if segment is not None:
            assert self.stopping is not None
            key = self.stopping.budget_key
            overrides = [o for o in overrides if o.partition("=")[0].lstrip("+~") != key] + [f"{key}={segment.to}"]
            if segment.start > 0:  # the last segment's: this one writes its own, or has not completed
                (job.output_dir / RESULT_FILE).unlink(missing_ok=True)
        composed = compose_job(hydra_context, config, overrides, job.num)
        with hydra_config_of(composed.config):
            cfg = composed.task_config()
            target = validate.build_target(cfg, self.registry)
            self.adopted.discard(job.num)
            adopted = self._reattach(target, ledger.jobs[job.num])
            if adopted is not None:
                self.adopted.add(job.num)
                return JobController(adopted, job.output_dir, annotate=True)
            env = {
                **{str(k): str(v) for k, v in composed.config.hydra.job.env_set.items()},
                SWEEP_NAME_ENV: ledger.name,
                SWEEP_JOB_ENV: str(job.num),
            }
            prepared = prepare.prepare(
                cfg,
                job_dir=job.output_dir,
                overrides=overrides,
                registry=self.registry,
                pm=self.pm,
                env=env,
                compute=target,
                launch=launch,
            )
        restarts = Restarts(
            prepared,
            controller.restart_policy(prepared, self.out),
            f"ddlkit: sweep job #{job.num} ",
            functools.partial(self._restarted, ledger, job.num),
        )
        handle = controller.submit(prepared, budget=restarts.policy.budget())
        return JobController(handle, prepared.spec.job_dir, restarts, annotate=True)

    @staticmethod
    def _restarted(ledger: Ledger, num: int, entry: dict[str, Any], handle: JobHandle) -> None:
        """A job restarted by its compute target's restart policy: counted in the ledger (apart from
        the sweep's own retries, ``attempts``), with the handle a re-run of the sweep re-attaches to."""
        record = ledger.jobs[num]
        ledger.update(
            num,
            restarts=record.restarts + 1,
            steps_lost=record.steps_lost + int(entry["steps_lost"]),  # type: ignore[call-overload]
            handle=handle.id,
        )

    @staticmethod
    def _reattach(target: ComputeTarget, record: JobRecord) -> JobHandle | None:
        """The job an earlier run of this sweep left running (the launcher was killed, or its
        machine restarted), if it still runs or has completed since: no job is submitted twice."""
        if record.status != "running" or not record.handle:
            return None
        try:
            handle = target.attach(record.handle, job_dir=Path(record.job_dir))
            state = handle.status().state
        except DdlkitError:
            return None
        return handle if state in (JobState.RUNNING, JobState.PENDING, JobState.SUCCEEDED) else None

    def _resume_command(self, sweep_dir: Path) -> list[str]:
        """The command that re-runs this sweep in the same directory (the CLI sets sys.argv to ddlkit's)."""
        args = [
            a
            for a in redact_overrides(sys.argv[1:])
            if a not in ("-m", "--multirun") and not a.startswith("hydra.sweep.dir=")
        ]
        return ["ddlkit", "-m", *args, override("hydra.sweep.dir", str(sweep_dir))]

    @staticmethod
    def _failure(record: JobRecord, stopped_by: int | None, ledger: Ledger, report: Path) -> SweepError:
        failed = sum(r.status == "failed" for r in ledger.jobs.values())
        label = " ".join(record.overrides) or "-"
        if record.status == "failed":
            code = f" (exit status {record.exit_code})" if record.exit_code is not None else ""
            what = f"failed{code}; its log: {record.log}"
        elif stopped_by is not None:
            what = f"{record.status}: on_failure=fail-fast stopped the sweep after job #{stopped_by} failed"
        else:
            what = record.status
        return SweepError(
            f"ddlkit: error: sweep job #{record.num} ({label}) {what}\n"
            f"  {failed} of {len(ledger.jobs)} jobs failed; report: {report}"
        )

    @staticmethod
    def _job_return(
        job: CheckedJob, record: JobRecord, failure: SweepError | None, objective: str | None, task_name: str
    ) -> JobReturn:
        """What Hydra's sweeper gets for the job: with ``sweep.objective``, that field of its result
        (what a search sweeper optimizes); else the whole result. A failed job's return raises."""
        ret = JobReturn(overrides=job.overrides, working_dir=str(job.output_dir), task_name=task_name)
        result_path = job.output_dir / RESULT_FILE
        result = json.loads(result_path.read_text()) if failure is None and result_path.is_file() else record.result
        if failure is None and objective is not None and (result or {}).get(objective) is None:
            failure = SweepError(
                f"ddlkit: error: sweep job #{job.num} completed, but its result has no "
                f"{objective} (e.g. best_top1 needs trainer.validate=true); choose another "
                "sweep.objective"
            )
        if failure is not None:
            ret.status, ret.return_value = TaskStatus.FAILED, failure
            return ret
        ret.status = TaskStatus.COMPLETED
        ret.return_value = float(result[objective]) if objective is not None else result
        return ret

    # ---------------------------------------------------------------- printing
    def say(self, text: str) -> None:
        """A line for the user, at once (the sweep runs for long; its progress must not sit in a buffer)."""
        self.out.write(text + "\n")
        self.out.flush()

    def _plan_lines(
        self, cfg: DictConfig, target: ComputeTarget, overrides: list[str], output_dir: Path, launch: list[str]
    ) -> str:
        """What ``ddlkit plan`` says of a job after its label and state: what it runs on, the
        command that runs it alone, and what its compute target would do."""
        code_env, snapshot = prepare.user_code(cfg, target, output_dir)
        env, secret_env = prepare.job_environment(cfg, self.pm, code_env)
        spec = JobSpec(
            name=prepare.job_name(output_dir),
            job_dir=output_dir,
            env=env,
            secret_env=secret_env,
            code_digest=snapshot.digest if snapshot is not None else None,
            # what a target that restarts in place would be given (compute=ray's plan shows it)
            restart=controller.policy_for(
                controller.restart_config(cfg.get("restart") or {}), target, self.out
            ).budget(),
        )
        command = job_command(redact_overrides(overrides), output_dir, launch)
        code = f"      code: {_code_line(snapshot)}\n" if snapshot is not None else ""
        needs = (
            f"      where the ranks run: {problem} (not needed here: compute={cfg.compute.name}'s ranks "
            "check their own environment when they start)\n"
            if (problem := self._needs_where_ranks_run(cfg, target))
            else ""
        )
        return (
            f"      compute={cfg.compute.name}, world size {target.world_size}, {cfg.framework.name} "
            f"{cfg.model.name}; {{state}}\n"
            f"      command: {command}\n{code}{needs}"
            f"      runs: {target.plan(spec)}"
        )

    def _needs_where_ranks_run(self, cfg: DictConfig, target: ComputeTarget) -> str | None:
        """What the framework needs that this environment lacks, for a target whose ranks run in
        their own (validation checked it already when they share this one)."""
        if target.ranks_share_environment:
            return None
        try:
            self.registry.create("framework", cfg.framework.name, cfg.framework).check_environment(cfg)
        except ConfigError as err:
            return str(err)
        return None

    def _print_plan(
        self,
        jobs: list[CheckedJob],
        ledger: Ledger,
        done: set[int],
        settings: SweepSettings,
        policy: FailurePolicy,
        stopping: EarlyStopping | None,
    ) -> None:
        sweep_dir = ledger.path.parent
        if len(jobs) == 1:  # one job: nothing of a sweep to say (how many at once, what a failure does to the rest)
            self.say(
                f"ddlkit plan: 1 job -> {sweep_dir}\n"
                + jobs[0].plan.replace("{state}", self._state(jobs[0], ledger, done), 1)
            )
            self.say("ddlkit plan: the job is valid; nothing was run.")
            return
        self.say(
            f"ddlkit plan: {_jobs(len(jobs))} -> {sweep_dir} (up to {settings.max_parallel} at once, "
            f"on_failure={policy})"
        )
        if stopping is not None:
            self.say(f"ddlkit plan: early stopping: {stopping.describe()}")
        labels = varying_overrides([JobRecord(j.num, self._overrides(j), "") for j in jobs])
        for job in jobs:
            self.say(
                f"  #{job.num} {labels[job.num] or '-'}\n"
                + job.plan.replace("{state}", self._state(job, ledger, done), 1)
            )
        self.say(f"ddlkit plan: all {len(jobs)} jobs are valid; nothing was run.")

    @staticmethod
    def _state(job: CheckedJob, ledger: Ledger, done: set[int]) -> str:
        record = ledger.jobs[job.num]
        return (
            "completed: skipped"
            if job.num in done
            else f"{record.status}: runs again in its directory"
            if record.attempts
            else "new"
        )

    def finish(self) -> None:
        """After the sweeper's last batch: a search's report of all its trials, and its best one."""
        if self._search is None:
            return
        ledger, report, objective = self._search
        self._print_summary(ledger, report, sorted(ledger.jobs), self.stopping)
        try:  # what the sweeper found (hydra-optuna-sweeper writes it when the study ends)
            found = OmegaConf.to_container(OmegaConf.load(ledger.path.parent / "optimization_results.yaml"))
        except (OSError, OmegaConfBaseException):
            return
        if "best_params" not in found:  # several objectives: no one best trial
            return
        # the sweeper made each trial's overrides of its parameters as key=value
        params = [f"{key}={value}" for key, value in found["best_params"].items()]
        best = next((r for r in ledger.jobs.values() if set(params) <= set(r.overrides)), None)
        params = " ".join(params)
        self.say(
            f"ddlkit: best of {_jobs(len(ledger.jobs)).replace('job', 'trial')}: {params} -> {objective} "
            f"{found['best_value']}" + (f" (job #{best.num}, {best.job_dir})" if best else "")
        )

    def _print_summary(
        self, ledger: Ledger, report: Report, nums: list[int], stopping: EarlyStopping | None = None
    ) -> None:
        seconds = time.perf_counter() - (self._started or time.perf_counter())
        counts: dict[str, list[int]] = {}
        for num in nums:
            counts.setdefault(ledger.jobs[num].status, []).append(num)
        parts = [
            f"{len(v)} {k}" + ("" if k == "completed" else f" ({', '.join(f'#{n}' for n in v)})")
            for k, v in sorted(counts.items())
        ]
        self.say(f"\n{report.markdown.read_text().strip()}\n")
        plot = (
            f", {report.png.name}"
            if report.png
            else "; no plot: matplotlib is not installed: pip install matplotlib, or pip install -e '.[sweep]' "
            "in ddlkit's checkout"
        )
        self.say(
            f"ddlkit: sweep done in {seconds:.1f} s: {', '.join(parts)}; report: {report.markdown} "
            f"({report.csv.name}{plot})"
        )
        if stopping is not None:
            self.say(f"ddlkit: {compute_trained(ledger, nums)}")


class _Progress(Observer):
    """Prints each start and end as it happens, and keeps the ledger and the report up to date."""

    def __init__(
        self,
        sweep: DdlkitSweep,
        ledger: Ledger,
        labels: dict[int, str],
        policy: FailurePolicy,
        report: LiveReport,
        ladder: Ladder | None = None,
        sweep_job: Callable[[int, Segment], SweepJob] | None = None,
        segments: dict[int, Segment] | None = None,
    ) -> None:
        self.sweep, self.ledger, self.labels, self.policy, self.report = sweep, ledger, labels, policy, report
        # what earlier runs of this sweep (before a resume) already spent on each job
        self.before = {n: (r.attempts, r.duration_s or 0.0) for n, r in ledger.jobs.items()}
        #: sweep.early_stopping: the trials' milestones, and the job of a trial's next segment
        #: and the segment each trial was last given (see ``DdlkitSweep.launch``)
        self.ladder, self.sweep_job, self.segments = ladder, sweep_job, segments or {}
        self._next: list[SweepJob] = []

    def follow_ups(self) -> list[SweepJob]:
        follow, self._next = self._next, []
        return follow

    def started(self, job: SweepJob, outcome: Outcome) -> None:
        record = self.ledger.jobs[job.num]
        attempts = self.before[job.num][0] + outcome.attempts
        adopted = job.num in self.sweep.adopted
        if adopted:  # an earlier run of the sweep started it, and counted the attempt
            attempts, outcome.started, outcome.submitted = record.attempts, record.started, record.submitted
        assert outcome.handle is not None
        self.ledger.update(
            job.num,
            status="running",
            attempts=attempts,
            submitted=outcome.submitted,
            started=outcome.started,
            ended=None,
            exit_code=None,
            error=None,
            name=prepare.job_name(Path(record.job_dir)),
            handle=outcome.handle.id,
            log=str(Path(record.job_dir) / RANK0_LOG),
        )
        again = f" (attempt {attempts})" if attempts > 1 else ""
        what = "still running: re-attached" if adopted else f"started{again}"
        if self.ladder is not None:
            segment = self.segments[job.num]
            self.ladder.started(job.num, segment)
            self.ledger.update(job.num, target=segment.to)
            unit = self.ladder.rule.unit
            what += (
                f", {unit} {segment.start} to {segment.to}" + (" (resumed)" if segment.start else "")
                if segment.to < self.ladder.rule.max_t or segment.start
                else ""
            )
        self.sweep.say(f"ddlkit: sweep job #{job.num} {what}: {self.labels[job.num] or '-'} -> {record.job_dir}")

    def ended(self, job: SweepJob, outcome: Outcome, *, will_retry: bool) -> None:
        record = self.ledger.jobs[job.num]
        attempts, spent = self.before[job.num]
        result = None
        if outcome.state == "completed":
            result = result_summary(json.loads((Path(record.job_dir) / RESULT_FILE).read_text()))
        if job.num in self.sweep.adopted:
            attempts -= 1  # the earlier run of the sweep counted the attempt this one re-attached to
        log = record.log if record.log and Path(record.log).is_file() else f"ddlkit jobs logs {record.name}"
        status, rung = outcome.state, {}
        if self.ladder is not None:
            status, rung = self._milestone(job, outcome, result is not None)
            if status == "failed":  # its metric could not be read: a failure to see, not a result
                result = None
        self.ledger.update(
            job.num,
            status=status,
            attempts=attempts + outcome.attempts,
            ended=outcome.ended,
            duration_s=round(spent + outcome.duration_s, 3),
            exit_code=outcome.exit_code,
            error=outcome.message or None,
            result=result,
            log=log,
            **rung,
        )
        self.report.update(self.ledger)
        head = f"ddlkit: sweep job #{job.num} {status} in {outcome.duration_s:.1f} s"
        if rung.get("decision") and self.ladder is not None:  # early stopping: a segment ended at a milestone
            ran = rung["segments"][-1]
            head = (
                f"ddlkit: sweep job #{job.num} reached {ran['to']} {self.ladder.rule.unit} "
                f"in {ran['ended'] - ran['started']:.1f} s"
            )
        if record.restarts:  # the restart policy's, over all attempts; the sweep's retries are attempts
            head += (
                f" ({record.restarts} restart{'s' if record.restarts > 1 else ''}, "
                f"{record.steps_lost} step{'s' if record.steps_lost != 1 else ''} lost)"
            )
        label = self.labels[job.num] or "-"
        if result is not None:
            decided = f"\n  {rung['decision']}" if rung.get("decision") else ""
            self.sweep.say(f"{head}: {label}: {_metrics(result)}{decided}")
            return
        lines = [f"{head}: {label}"]
        message = [line for line in outcome.message.splitlines() if line.strip()]
        # the target's explanation, then the end of the log it quotes (where the error is)
        lines += ["    " + line for line in message[:1] + (["    ..."] if len(message) > 7 else []) + message[1:][-6:]]
        lines.append(f"  log: {record.log}")
        if will_retry:
            lines.append(
                f"  retrying it (retry {outcome.attempts} of {self.policy.retries}); it resumes from its checkpoint"
            )
        self.sweep.say("\n".join(lines))

    def _milestone(self, job: SweepJob, outcome: Outcome, completed: bool) -> tuple[str, dict[str, Any]]:
        """Under early stopping, a trial's segment ended: its status and what the ledger keeps of it
        (the segment; at a milestone its value, the decision and why, and the promotions it made)."""
        assert self.ladder is not None and self.sweep_job is not None
        record, segment = self.ledger.jobs[job.num], self.segments[job.num]
        ran = {"started": outcome.started, "ended": outcome.ended, "from": segment.start, "to": segment.to}
        changes: dict[str, Any] = {"segments": [*(record.segments or []), ran]}
        if not completed:
            return outcome.state, changes
        try:
            value = last_value(Path(record.job_dir), self.ladder.rule.metric)
        except ConfigError as err:
            outcome.message = str(err)
            return "failed", changes
        verdict = self.ladder.arrived(job.num, segment.to, value)
        changes["rung_values"] = {**(record.rung_values or {}), str(segment.to): value}
        changes["target"] = self.ladder.target[job.num]
        changes["decision"] = f"{verdict.status} at {segment.to} {self.ladder.rule.unit}: {verdict.why}"
        with contextlib.suppress(DdlkitError):  # `ddlkit jobs status` of the trial's job says it too
            submission = index.load(Path(record.job_dir))
            submission.sweep_decision = changes["decision"]
            submission.save()
        for num, promoted in verdict.runs:
            if num != job.num:
                self.ledger.update(num, status=PROMOTED, target=promoted.to)
                self.sweep.say(
                    f"ddlkit: sweep job #{num} promoted: resumes at {promoted.start} {self.ladder.rule.unit} "
                    f"to run to {promoted.to}"
                )
            self._next.append(self.sweep_job(num, promoted))
        return verdict.status, changes


def _metrics(result: dict[str, Any]) -> str:
    parts = [f"{f.title} {f.format.format(result[f.name])}" for f in HEADLINE if result.get(f.name) is not None]
    return ", ".join(parts) or "no metrics"


def _ladder(
    stopping: EarlyStopping, nums: list[int], ledger: Ledger, trials: dict[int, Any] | None, pruning: Pruning | None
) -> Ladder:
    """The trials ``nums`` on their milestones, as the ledger has them; with Optuna's pruners, each
    paired with its study trial."""
    reached = {num: (ledger.jobs[num].rung_values, ledger.jobs[num].target) for num in nums}
    if stopping.rule != "optuna":
        return Ladder(stopping, reached)
    from .optuna import PrunerLadder

    assert trials is not None and pruning is not None, "hydra/sweeper=optuna_pruning hands out the trials"
    return PrunerLadder(stopping, reached, trials, pruning)


def _check_study_direction(stopping: EarlyStopping, sweeper: Any) -> None:
    """An Optuna pruner compares the trials' reported values the study's way: the metric reported
    must be better in the direction the study optimizes."""
    from .settings import _sweeper_direction

    study = _sweeper_direction(sweeper) or "minimize"  # Optuna's default
    if (study == "maximize") != stopping.maximize:
        raise ConfigError(
            f"sweep.early_stopping.metric={stopping.metric} is better {'up' if stopping.maximize else 'down'}, but "
            f"the study's direction is {study}: its pruner would keep the worst trials. Report a metric that is "
            "better the study's way, or set hydra.sweeper.direction (and sweep.early_stopping.mode) to agree."
        )


def _early_stopping(options: Any, jobs: Sequence[CheckedJob]) -> EarlyStopping | None:
    """``sweep.early_stopping``'s rule for ``jobs``, which it compares at the same budgets."""
    if options is None:
        return None
    budgets = sorted({j.budget for j in jobs if j.budget is not None})
    if len(budgets) > 1:
        raise ConfigError(
            "sweep.early_stopping compares trials at the same budgets, but these jobs' differ "
            f"({', '.join(map(str, budgets))} {options.unit}): set sweep.early_stopping.max_t=<{options.unit}> "
            "(at most the smallest), or sweep trainer.epochs in sweeps of its own."
        )
    return EarlyStopping.from_options(options, max_t=budgets[0]) if budgets else None


def check_sweep_settings_fixed(job_overrides: Sequence[Sequence[str]]) -> None:
    """``sweep.*`` configures the sweep as a whole: one value for all jobs, never a swept one."""
    values: dict[str, set[str]] = {}
    for overrides in job_overrides:
        for given in overrides:
            key, _, value = given.partition("=")
            if key.lstrip("+~").startswith("sweep."):
                values.setdefault(key, set()).add(value)
    swept = sorted(key for key, seen in values.items() if len(seen) > 1)
    if swept:
        raise ConfigError(
            f"{', '.join(swept)} cannot vary within a sweep: it configures the sweep itself. Give it one value."
        )


def hold_sweep_directory(sweep_dir: Path) -> TextIO:
    """Lock the sweep directory for this launcher, or raise ConfigError naming the one that holds
    it: two launchers of one sweep would each run its jobs and rewrite its ledger, each taking the
    other's jobs for failed ones."""
    try:
        return hold_lock(sweep_dir / SWEEP_LOCK)
    except LockHeld as holder:
        raise ConfigError(
            f"{sweep_dir} is in use by another launcher of this sweep ({holder}): wait for it to end "
            "(`ddlkit jobs list` shows its jobs), or stop it (Ctrl-C where it runs, or `kill` its pid: "
            "its jobs checkpoint and stop), then run this command again to resume the sweep."
        ) from None


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _remove_plan_leftovers(sweep_dir: Path) -> None:
    """Hydra's sweeper wrote ``multirun.yaml`` (making the directories) before the plan was asked
    for; a plan leaves nothing behind."""
    (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
    prepare.remove_empty_dirs(sweep_dir)


def _code_line(snapshot: CodeSnapshot) -> str:
    """What ``ddlkit plan`` says a job ships of the launch directory."""
    shown = [path for path, _ in snapshot.files[:_PLANNED_FILES]]
    more = len(snapshot.files) - len(shown)
    return (
        f"a snapshot of the launch directory ships with the job ({snapshot.describe()}): {', '.join(shown)}"
        + (f" and {more} more" if more else "")
        + "".join(f"; {said}" for said in snapshot.left_out())
    )
