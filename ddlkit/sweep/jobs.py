"""``ddlkit -m``: the sweep of ddlkit training jobs, run by the ddlkit launcher.

The CLI attaches a :class:`DdlkitSweep` to its task function (attribute :data:`SWEEP_ATTR`);
the launcher (:mod:`ddlkit.sweep.launch`) finds it there and hands it the sweep's jobs instead
of calling the task function once per job. Then:

1. every job is composed and validated (``engine.validate``) before any starts: one bad value
   in any job is reported, with the job, and nothing runs (exit status 2);
2. the ledger (:mod:`.ledger`) is opened: a re-run of the same sweep skips completed jobs;
3. the scheduler (:mod:`.scheduler`) prepares each job (``engine.prepare``: its job directory,
   as for a single run) and submits it to the job's compute target as a slot frees up, with
   ``DDLKIT_SWEEP_NAME``/``DDLKIT_SWEEP_JOB`` in its environment (loggers group runs by them);
4. starts and ends are printed as they happen, failures with their error and log;
5. the report (:mod:`.report`) is written, and the exit status set: 0 all completed, 1 a job
   failed, 75 interrupted (resumable).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from hydra.core.utils import JobReturn
from hydra.core.utils import JobStatus as TaskStatus
from hydra.errors import CompactHydraException, HydraException
from omegaconf.errors import OmegaConfBaseException

from .. import engine
from .. import secrets as secret_store
from ..errors import ConfigError, DdlkitError, exit_code_for
from ..interfaces import JobHandle, JobState, JobStatus
from ..run import EXIT_PREEMPTED
from . import SWEEP_JOB_ENV, SWEEP_NAME_ENV
from .compose import ComposedJob, compose_job, hydra_config_of
from .ledger import LEDGER_FILE, JobRecord, Ledger, result_summary
from .report import LiveReport, Report, varying_overrides
from .scheduler import Observer, Outcome, Scheduler, SweepJob
from .settings import FailurePolicy, SweepSettings

if TYPE_CHECKING:
    from hydra.types import HydraContext
    from omegaconf import DictConfig

    from ..plugins import DdlkitPluginManager
    from ..registry import Registry

#: the task-function attribute through which the launcher finds ddlkit's sweep support
SWEEP_ATTR = "ddlkit_sweep"
RANK0_LOG = "rank-0.log"


class SweepError(CompactHydraException):
    """A job's failure, in the JobReturn Hydra gets: its sweeper prints the message (no traceback)."""


def sweep_name(sweep_dir: Path) -> str:
    """``multirun/2026-11-22/10-04-01`` -> ``2026-11-22_10-04-01``, as single jobs are named."""
    return f"{sweep_dir.parent.name}_{sweep_dir.name}".replace(" ", "_")


class DdlkitSweep:
    def __init__(self, registry: Registry, pm: DdlkitPluginManager, *, job_name: Callable[[Any], str],
                 out: TextIO | None = None) -> None:
        self.registry, self.pm = registry, pm
        #: names a job from its ``hydra`` config node, exactly as the CLI names a single run
        self.job_name = job_name
        self.out = out or sys.stdout
        #: the exit status ``ddlkit -m`` ends with; None until the launcher has run
        self.exit_code: int | None = None

    # ---------------------------------------------------------------- entry point (the launcher's)
    def launch(self, settings: SweepSettings, *, hydra_context: HydraContext, config: DictConfig,
               job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        had_ledger = (sweep_dir / LEDGER_FILE).is_file()
        try:
            policy = settings.policy("sweep")
            jobs = self._compose_and_validate(hydra_context, config, job_overrides, initial_job_idx)
            ledger = Ledger.open(sweep_dir, sweep_name(sweep_dir))
            done = set(ledger.reconcile((j.num, self._overrides(j), str(j.output_dir)) for j in jobs))
            if settings.dry_run:
                self._print_plan(jobs, ledger, done, settings, policy)
                self._set_exit(0)
                return []
        except DdlkitError as err:
            self._end(exit_code_for(err), f"ddlkit: error: {err}")
        finally:
            if settings.dry_run and not had_ledger:
                _remove_plan_leftovers(sweep_dir)
        ledger.command = self._resume_command(sweep_dir)
        ledger.save()
        todo = [j for j in jobs if j.num not in done]
        labels = varying_overrides(list(ledger.jobs.values()))
        computes = sorted({str(j.config.compute.name) for j in jobs})
        self.say(f"ddlkit: sweep of {len(jobs)} jobs -> {sweep_dir} (up to {settings.max_parallel} at once on "
                    f"compute={','.join(computes)}, on_failure={policy})"
                    + (f"; {len(done)} completed before, skipped" if done else ""))
        live_report = LiveReport(settings.sort_by)
        progress = _Progress(self, ledger, labels, policy, live_report)
        scheduler = Scheduler(settings.max_parallel, policy, poll_interval_s=settings.poll_interval_s,
                              observer=progress)
        t0 = time.perf_counter()
        sweep = scheduler.run([SweepJob(j.num, labels[j.num], functools.partial(self._submit, j, ledger.name))
                               for j in todo])
        report = live_report.close(ledger)
        self._print_summary(ledger, report, time.perf_counter() - t0, [j.num for j in jobs])
        if sweep.interrupted:
            self._end(EXIT_PREEMPTED, "ddlkit: sweep interrupted; its running jobs checkpointed and stopped.\n"
                                      f"  resume with: {shlex.join(ledger.command)}")
        failures = {j.num: self._failure(ledger.jobs[j.num], sweep.stopped_by, ledger, report.markdown)
                    for j in jobs if ledger.jobs[j.num].status != "completed"}
        self._set_exit(1 if failures else 0)
        return [self._job_return(j, ledger.jobs[j.num], failures.get(j.num)) for j in jobs]

    # ---------------------------------------------------------------- before anything runs
    def _compose_and_validate(self, hydra_context: HydraContext, config: DictConfig,
                              job_overrides: Sequence[Sequence[str]], first: int) -> list[ComposedJob]:
        check_sweep_settings_fixed(job_overrides)
        jobs, errors = [], []
        for i, overrides in enumerate(job_overrides):
            num, label = first + i, " ".join(secret_store.redact_overrides(overrides)) or "-"
            try:
                job = compose_job(hydra_context, config, overrides, num)
                with hydra_config_of(job.config):
                    engine.validate(job.task_config(), self.registry, self.pm)
            except DdlkitError as err:
                errors.append(f"job #{num} ({label}): {err}")
                continue
            except (HydraException, OmegaConfBaseException) as err:  # Hydra could not compose it: a bad type, ...
                cause = f": {err.__cause__}" if err.__cause__ else ""
                errors.append(f"job #{num} ({label}): {err}{cause}")
                continue
            jobs.append(job)
        if errors:
            noun = "job is" if len(errors) == 1 else "jobs are"
            raise ConfigError(f"{len(errors)} of {len(job_overrides)} sweep {noun} invalid; no job was started:\n  "
                              + "\n  ".join(errors))
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
    def _overrides(job: ComposedJob) -> list[str]:
        return secret_store.redact_overrides(job.overrides)

    # ---------------------------------------------------------------- running
    def _submit(self, job: ComposedJob, name: str) -> JobHandle:
        with hydra_config_of(job.config):
            prepared = engine.prepare(job.task_config(), job_dir=job.output_dir,
                                      job_name=self.job_name(job.config.hydra), overrides=job.overrides,
                                      registry=self.registry, pm=self.pm)
        env = {**prepared.spec.env, **{str(k): str(v) for k, v in job.config.hydra.job.env_set.items()},
               SWEEP_NAME_ENV: name, SWEEP_JOB_ENV: str(job.num)}
        spec = dataclasses.replace(prepared.spec, env=env)
        return _ResultCheckingHandle(prepared.compute.submit(spec), spec.job_dir / "result.json")

    def _resume_command(self, sweep_dir: Path) -> list[str]:
        """The command that re-runs this sweep in the same directory (the CLI sets sys.argv to ddlkit's)."""
        args = [a for a in secret_store.redact_overrides(sys.argv[1:])
                if a not in ("-m", "--multirun") and not a.startswith("hydra.sweep.dir=")]
        return ["ddlkit", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]

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
        return SweepError(f"ddlkit: error: sweep job #{record.num} ({label}) {what}\n"
                          f"  {failed} of {len(ledger.jobs)} jobs failed; report: {report}")

    @staticmethod
    def _job_return(job: ComposedJob, record: JobRecord, failure: SweepError | None) -> JobReturn:
        ret = JobReturn(overrides=job.overrides, cfg=job.task_config(), hydra_cfg=job.hydra_config(),
                        working_dir=str(job.output_dir), task_name=str(job.config.hydra.job.name))
        if failure is not None:
            ret.status, ret.return_value = TaskStatus.FAILED, failure
            return ret
        result_path = job.output_dir / "result.json"
        ret.status = TaskStatus.COMPLETED
        ret.return_value = json.loads(result_path.read_text()) if result_path.is_file() else record.result
        return ret

    # ---------------------------------------------------------------- printing
    def say(self, text: str) -> None:
        """A line for the user, at once (the sweep runs for long; its progress must not sit in a buffer)."""
        self.out.write(text + "\n")
        self.out.flush()

    def _print_plan(self, jobs: list[ComposedJob], ledger: Ledger, done: set[int], settings: SweepSettings,
                    policy: FailurePolicy) -> None:
        sweep_dir = ledger.path.parent
        self.say(f"ddlkit plan: {len(jobs)} jobs -> {sweep_dir} (up to {settings.max_parallel} at once, "
                    f"on_failure={policy})")
        labels = varying_overrides([JobRecord(j.num, self._overrides(j), "") for j in jobs])
        for job in jobs:
            cfg = job.config
            target = self.registry.create("compute", cfg.compute.name, cfg.compute)
            record = ledger.jobs[job.num]
            state = ("completed: skipped" if job.num in done else
                     f"{record.status}: runs again in its directory" if record.attempts else "new")
            command = shlex.join(["ddlkit", *self._overrides(job), f"hydra.run.dir={job.output_dir}"])
            self.say(f"  #{job.num} {labels[job.num] or '-'}\n"
                        f"      compute={cfg.compute.name}, world size {target.world_size}, {cfg.framework.name} "
                        f"{cfg.model.name}; {state}\n"
                        f"      command: {command}")
        self.say(f"ddlkit plan: all {len(jobs)} jobs are valid; nothing was run.")

    def _print_summary(self, ledger: Ledger, report: Report, seconds: float, nums: list[int]) -> None:
        counts: dict[str, list[int]] = {}
        for num in nums:
            counts.setdefault(ledger.jobs[num].status, []).append(num)
        parts = [f"{len(v)} {k}" + ("" if k == "completed" else f" ({', '.join(f'#{n}' for n in v)})")
                 for k, v in sorted(counts.items())]
        self.say(f"\n{report.markdown.read_text().strip()}\n")
        plot = (f", {report.png.name}" if report.png
                else " (no plot: matplotlib is not installed; pip install 'ddlkit[sweep]')")
        self.say(f"ddlkit: sweep done in {seconds:.1f} s: {', '.join(parts)}; report: {report.markdown} "
                    f"({report.csv.name}{plot})")


class _Progress(Observer):
    """Prints each start and end as it happens, and keeps the ledger and the report up to date."""

    def __init__(self, sweep: DdlkitSweep, ledger: Ledger, labels: dict[int, str], policy: FailurePolicy,
                 report: LiveReport) -> None:
        self.sweep, self.ledger, self.labels, self.policy, self.report = sweep, ledger, labels, policy, report
        # what earlier runs of this sweep (before a resume) already spent on each job
        self.before = {n: (r.attempts, r.duration_s or 0.0) for n, r in ledger.jobs.items()}

    def started(self, job: SweepJob, outcome: Outcome) -> None:
        record = self.ledger.jobs[job.num]
        attempts = self.before[job.num][0] + outcome.attempts
        self.ledger.update(job.num, status="running", attempts=attempts, submitted=outcome.submitted,
                           started=outcome.started, ended=None, exit_code=None, error=None,
                           log=str(Path(record.job_dir) / RANK0_LOG))
        again = f" (attempt {attempts})" if attempts > 1 else ""
        self.sweep.say(f"ddlkit: sweep job #{job.num} started{again}: {self.labels[job.num] or '-'} -> "
                          f"{record.job_dir}")

    def ended(self, job: SweepJob, outcome: Outcome, *, will_retry: bool) -> None:
        record = self.ledger.jobs[job.num]
        attempts, spent = self.before[job.num]
        result = None
        if outcome.state == "completed":
            result = result_summary(json.loads((Path(record.job_dir) / "result.json").read_text()))
        self.ledger.update(job.num, status=outcome.state, attempts=attempts + outcome.attempts,
                           ended=outcome.ended, duration_s=round(spent + outcome.duration_s, 3),
                           exit_code=outcome.exit_code, error=outcome.message or None, result=result)
        self.report.update(self.ledger)
        head = f"ddlkit: sweep job #{job.num} {outcome.state} in {outcome.duration_s:.1f} s"
        label = self.labels[job.num] or "-"
        if result is not None:
            self.sweep.say(f"{head}: {label}: {_metrics(result)}")
            return
        lines = [f"{head}: {label}"]
        message = [line for line in outcome.message.splitlines() if line.strip()]
        # the target's explanation, then the end of the log it quotes (where the error is)
        lines += ["    " + line for line in message[:1] + (["    ..."] if len(message) > 7 else []) + message[1:][-6:]]
        lines.append(f"  log: {record.log}")
        if will_retry:
            lines.append(f"  retrying it (retry {outcome.attempts} of {self.policy.retries}); it resumes from its "
                         "checkpoint")
        self.sweep.say("\n".join(lines))


def _metrics(result: dict[str, Any]) -> str:
    parts = []
    for key, title, fmt in (("images_per_sec", "images/sec", "{:.1f}"), ("final_loss", "final loss", "{:.4f}"),
                            ("best_top1", "best val top-1", "{:.4f}")):
        if result.get(key) is not None:
            parts.append(f"{title} {fmt.format(result[key])}")
    return ", ".join(parts) or "no metrics"


def check_sweep_settings_fixed(job_overrides: Sequence[Sequence[str]]) -> None:
    """``sweep.*`` configures the sweep as a whole: one value for all jobs, never a swept one."""
    values: dict[str, set[str]] = {}
    for overrides in job_overrides:
        for override in overrides:
            key, _, value = override.partition("=")
            if key.lstrip("+~").startswith("sweep."):
                values.setdefault(key, set()).add(value)
    swept = sorted(key for key, seen in values.items() if len(seen) > 1)
    if swept:
        raise ConfigError(f"{', '.join(swept)} cannot vary within a sweep: it configures the sweep itself. "
                          "Give it one value.")


def _remove_plan_leftovers(sweep_dir: Path) -> None:
    """Hydra's sweeper wrote ``multirun.yaml`` (making the directories) before the plan was asked
    for; a plan leaves nothing behind. Removes directories only while they are empty, up to the
    working directory."""
    (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
    cwd = Path.cwd().resolve()
    here = sweep_dir
    while here != cwd:
        try:
            here.rmdir()
        except OSError:
            return
        if cwd not in here.parents:
            return
        here = here.parent


class _ResultCheckingHandle(JobHandle):
    """A compute target's handle, plus ddlkit's rule for a job's end (as ``engine.run_job`` applies
    it): a job that exits cleanly without writing result.json has failed."""

    def __init__(self, inner: JobHandle, result_path: Path) -> None:
        self.inner, self.result_path, self.id = inner, result_path, inner.id

    def _checked(self, status: JobStatus) -> JobStatus:
        if status.state is JobState.SUCCEEDED and not self.result_path.is_file():
            return JobStatus(JobState.FAILED, status.exit_code,
                             f"the job exited cleanly but wrote no {self.result_path}")
        return status

    def status(self) -> JobStatus:
        return self._checked(self.inner.status())

    def logs(self, follow: bool = True) -> Iterator[str]:
        return self.inner.logs(follow)

    def cancel(self) -> None:
        self.inner.cancel()

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self._checked(self.inner.wait(timeout))
