"""``compute=elsewhere``: a stand-in for a remote cluster that proves a job needs nothing of the
launcher's but what the compute contract hands over.

It behaves as a target whose ranks run on another machine would, with what one machine has:

* ``submit`` refuses a job whose environment names a path of this machine (a laptop's path means nothing on a
  cluster: user code travels as the job's code snapshot), copies the job directory to the "cluster's disk"
  (``compute.root/<job name>``), **moves the launcher's job directory out of reach** for as long as the job runs
  (anything that reaches for the launcher's paths fails), and runs the job there in a process with that copy as its
  working directory and a **bare environment**: ``PATH``, ``HOME``, ``LANG`` and what ``JobSpec.env`` /
  ``JobSpec.secret_env`` carry -- nothing inherited from the launcher;
* ``collect`` moves the launcher's directory back and copies the job's files into it;
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
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compute.process import ProcessJob
from ..errors import ConfigError
from ..interfaces import JOB_FILE, ComputeTarget, JobHandle, JobSpec, JobStatus
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


class ElsewhereHandle(JobHandle):
    def __init__(self, remote: ProcessJob, name: str, job_dir: Path) -> None:
        self.remote, self.name, self.job_dir = remote, name, Path(job_dir)
        self.id = f"{name}/{remote.id}"

    def status(self) -> JobStatus:
        return self.remote.status()

    def logs(self, follow: bool = True) -> Iterator[str]:
        return self.remote.logs(follow)

    def cancel(self) -> None:
        self.remote.cancel()

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self.remote.wait(timeout)

    def detach(self) -> None:
        self.remote.detach()

    def collect(self) -> None:
        """Put the launcher's directory back (keeping what the launcher wrote meanwhile, e.g. its
        submission record), then copy in what the job wrote. The remote side's own bookkeeping
        (``STATE_DIR``) stays there."""
        away = self.job_dir.with_name(self.job_dir.name + AWAY_SUFFIX)
        if away.is_dir():
            if self.job_dir.is_dir():
                shutil.copytree(self.job_dir, away, dirs_exist_ok=True)
                shutil.rmtree(self.job_dir)
            os.replace(away, self.job_dir)
        shutil.copytree(
            self.remote.job_dir,
            self.job_dir,
            dirs_exist_ok=True,
            ignore=lambda d, names: [STATE_DIR] if Path(d) == self.remote.job_dir else [],
        )


class ElsewhereTarget(ComputeTarget):
    cfg: ElsewhereComputeConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.status_interval_s = cfg.poll_interval_s
        self.root = Path(cfg.root or Path(tempfile.gettempdir()) / "ddlkit-elsewhere").expanduser().resolve()

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
        return ElsewhereHandle(remote, spec.name, spec.job_dir)

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        name, _, pid = job_id.rpartition("/")
        if not name or not (self.root / name).is_dir():
            raise ConfigError(f"compute=elsewhere has no job {job_id!r} under {self.root}.")
        remote = ProcessJob.attach(
            pid, job_dir=self.root / name, log_name=rank_log(0), grace_period_s=self.cfg.grace_period_s
        )
        return ElsewhereHandle(remote, name, job_dir)

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
