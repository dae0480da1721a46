"""``compute=elsewhere``: a stand-in for a remote cluster that proves a job needs nothing of the
launcher's but what the compute contract hands over.

It behaves as a target whose ranks run on another machine would, with what one machine has:

* ``submit`` refuses a job whose environment names a path of this machine (a laptop's path means nothing on a
  cluster: user code travels as the job's code snapshot), copies the job directory to the "cluster's disk"
  (``compute.root/<job name>``), **moves the launcher's job directory out of reach** for as long as the job runs
  (anything that reaches for the launcher's paths fails), and runs the job there in a process with that copy as its
  working directory and a **bare environment**: ``PATH``, ``HOME``, ``LANG`` and what ``JobSpec.env`` /
  ``JobSpec.secret_env`` carry -- nothing inherited from the launcher;
* ``collect`` (its scheduler's ``fetch``) moves the launcher's directory back and copies the job's files into it;
* its jobs outlive the launcher (as a cluster's do); ``attach`` works from any process (the id
  names the job and its process);
* it is polled at ``compute.poll_interval_s``, as a slow remote service would be.

Third-party target authors: run :class:`~ddlkit.testing.contracts.ComputeTargetContract` on
your target, and your training runs end to end on this one to see what a remote run needs.
The fakes module registers it (``DDLKIT_PLUGINS=ddlkit.testing.fakes``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..compute.outcome import Observation
from ..compute.process import ProcessJob, kill_session
from ..compute.scheduler import Scheduler, SchedulerJob
from ..errors import ConfigError
from ..interfaces import JOB_FILE, ComputeTarget, JobHandle, JobSpec, JobState
from ..jobdir import STATE_DIR, rank_log
from ..options import POSITIVE, checked

AWAY_SUFFIX = ".away"


@dataclass
class ElsewhereComputeConfig:
    # the "cluster's disk": jobs run in <root>/<job name>; null: <system temp dir>/ddlkit-elsewhere
    root: str | None = None
    # seconds between status calls a watcher should keep (a remote service is not asked every 50 ms)
    poll_interval_s: float = checked(0.2, POSITIVE)
    # seconds a cancelled job gets to checkpoint before it is killed
    grace_period_s: float = 30.0


class ElsewhereScheduler(Scheduler):
    """The "cluster" as a scheduler adapter: each job is a process under ddlkit's minder in its copy
    of the job directory (``<root>/<job name>``); its id is ``<job name>/<pid>``. It says what it sees
    and passes signals on; :class:`~ddlkit.compute.scheduler.SchedulerJob` does the rest."""

    noun = "elsewhere job"

    def __init__(self, root: Path, grace_period_s: float) -> None:
        self.root, self.grace = root, grace_period_s

    def process(self, job_id: str) -> ProcessJob:
        """The job's process on the cluster (what :func:`ProcessJob.attach` sees of it)."""
        name, _, pid = job_id.rpartition("/")
        if not name or not (self.root / name).is_dir():
            raise ConfigError(f"compute=elsewhere has no job {job_id!r} under {self.root}.")
        return ProcessJob.attach(pid, job_dir=self.root / name, log_name=rank_log(0), grace_period_s=self.grace)

    def describe(self, job_id: str) -> Observation:
        seen = self.process(job_id).status()  # the process's state, and its exit code once it ended
        if not seen.state.done:
            return Observation(seen.state, reason=f"process {job_id} on the cluster's disk")
        ended = JobState.SUCCEEDED if seen.exit_code == 0 else JobState.FAILED
        return Observation(ended, seen.exit_code)

    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        process = self.process(job_id)
        if how == "stop":
            process.cancel()  # SIGTERM: the ranks checkpoint and stop
        else:
            kill_session(process.pid, signal.SIGKILL)

    def read_log(self, job_id: str, offset: int) -> str:
        try:
            return self.process(job_id).log_path.read_text(errors="replace")[offset:]
        except FileNotFoundError:
            return ""

    def fetch(self, job_id: str, job_dir: Path) -> None:
        """Put the launcher's directory back (keeping what the launcher wrote meanwhile, e.g. its
        submission record), then copy in what the job wrote. The remote side's own bookkeeping
        (``STATE_DIR``) stays there."""
        remote_dir = self.process(job_id).job_dir
        away = job_dir.with_name(job_dir.name + AWAY_SUFFIX)
        if away.is_dir():
            if job_dir.is_dir():
                shutil.copytree(job_dir, away, dirs_exist_ok=True)
                shutil.rmtree(job_dir)
            os.replace(away, job_dir)
        theirs = lambda d, names: [STATE_DIR] if Path(d) == remote_dir else []  # noqa: E731
        shutil.copytree(remote_dir, job_dir, dirs_exist_ok=True, ignore=theirs)


class ElsewhereTarget(ComputeTarget):
    cfg: ElsewhereComputeConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.status_interval_s = cfg.poll_interval_s
        self.root = Path(cfg.root or Path(tempfile.gettempdir()) / "ddlkit-elsewhere").expanduser().resolve()
        self.scheduler = ElsewhereScheduler(self.root, cfg.grace_period_s)

    def _bare_environment(self, spec: JobSpec) -> dict[str, str]:
        base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
        return {**base, **spec.env, **spec.secret_env, "PYTHONUNBUFFERED": "1"}

    def submit(self, spec: JobSpec) -> JobHandle:
        _refuse_launcher_paths(spec)
        remote_dir = self.root / spec.name
        shutil.rmtree(remote_dir, ignore_errors=True)
        shutil.copytree(spec.job_dir, remote_dir, ignore=shutil.ignore_patterns(STATE_DIR))
        away = spec.job_dir.with_name(spec.job_dir.name + AWAY_SUFFIX)
        shutil.rmtree(away, ignore_errors=True)
        os.replace(spec.job_dir, away)
        # the launcher keeps its job file (``ddlkit jobs`` rebuilds the target from it); the rest is away
        spec.job_dir.mkdir()
        shutil.copy2(away / JOB_FILE, spec.job_dir / JOB_FILE)
        remote = ProcessJob.start(
            spec.command(sys.executable),
            job_dir=remote_dir,
            log_name=rank_log(0),
            env=self._bare_environment(spec),
            grace_period_s=self.cfg.grace_period_s,
        )
        remote.detach()  # a cluster's job does not die with the launcher that submitted it
        return self.attach(f"{spec.name}/{remote.id}", job_dir=spec.job_dir)

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        self.scheduler.process(job_id)  # refuses an id the cluster does not know
        return SchedulerJob(
            self.scheduler,
            job_id,
            job_dir=job_dir,
            world_size=1,
            poll_interval_s=self.cfg.poll_interval_s,
            grace_period_s=self.cfg.grace_period_s,
        )

    def plan(self, spec: JobSpec) -> str:
        return f"copy {spec.job_dir} to {self.root / spec.name}; there: {' '.join(spec.command('python'))}"


def _refuse_launcher_paths(spec: JobSpec) -> None:
    for key, value in {**spec.env, **spec.secret_env}.items():
        if os.path.isabs(value) and os.path.exists(value):
            raise ConfigError(
                f"compute=elsewhere: the job's environment names a path of the launcher's machine "
                f"({key}={value}); on a cluster it does not exist. A compute target's job carries "
                "what its ranks need in the job directory (user code: its code snapshot)."
            )
