"""Run the job's single rank as a process on this machine. It is the default: the quick start and
every run without `compute=` use it, and it needs nothing installed beyond ddlkit.

    ddlkit trainer.epochs=2                          # compute=local is the default
    ddlkit --detach trainer.epochs=90 model=resnet50 # returns at once; the job runs on

The rank runs in its job directory, and its output goes to `rank-0.log` and streams to the
terminal. A cancel (Ctrl-C, SIGTERM to `ddlkit`, `ddlkit jobs cancel`) sends the rank SIGTERM:
it checkpoints at its next step and exits with status 75, and after `compute.grace_period_s` it
is killed. A job the launcher did not detach is killed when the launcher exits, so nothing is
left running by mistake ([Jobs that outlive the shell](../jobs.md)).

`compute=local` does not restart a job the infrastructure ended (a killed process was most
likely killed on purpose; [Failures, restarts and elastic jobs](../failures.md) has each
target's defaults). For several ranks on this machine use
[compute=local_mpi](local_mpi.md); for a cluster, see
[From a laptop to a cluster](../../tutorials/laptop-to-cluster.md).

Status: works.

## How it works

The rank runs under `ddlkit.compute.process.ProcessJob`: in the job directory, in a session of
its own (cancelling reaches everything it started), with the launcher's environment plus the
job's. The process minder keeps the output and the exit code in the job directory, so another
shell can follow, judge and cancel the job (`ddlkit jobs`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..hookspecs import hookimpl
from ..interfaces import ComputeTarget, JobHandle, JobSpec
from ..jobdir import rank_log
from ..registry import Registration

RANK0_LOG = rank_log(0)


@dataclass
class LocalComputeConfig:
    # seconds a cancelled job gets to checkpoint at its next step before it is killed
    grace_period_s: float = 30.0


class LocalTarget(ComputeTarget):
    # a local process answers at once: a sweep starts the next job as soon as one ends
    status_interval_s = 0.05
    shares_job_dir = True
    ranks_share_environment = True
    default_max_restarts = 0
    default_capacity_wait_s = 0.0

    def submit(self, spec: JobSpec) -> JobHandle:
        from ..compute.process import ProcessJob  # here: composing a config starts no process

        # the launcher's own environment (same machine, same user) plus what the job asks for
        env = {**os.environ, **spec.env, **spec.secret_env, "PYTHONUNBUFFERED": "1"}
        return ProcessJob.start(
            spec.command(sys.executable),
            job_dir=spec.job_dir,
            log_name=RANK0_LOG,
            env=env,
            grace_period_s=self.cfg.grace_period_s,
        )

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        from ..compute.process import ProcessJob  # here: composing a config starts no process

        return ProcessJob.attach(job_id, job_dir=job_dir, log_name=RANK0_LOG, grace_period_s=self.cfg.grace_period_s)


@hookimpl
def ddlkit_compute_targets():
    yield Registration(
        "local", LocalTarget, config=LocalComputeConfig, description="one rank, a process on this machine"
    )
