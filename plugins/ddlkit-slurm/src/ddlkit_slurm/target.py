r"""One ddlkit job is one Slurm batch job: `compute.nodes` x `compute.procs_per_node` ranks, started
by `srun` inside the allocation. Run ddlkit on the cluster's
login node (`sbatch` on `PATH`), in a directory on the file system the nodes share (home or
project space): the ranks run in the launcher's own job directory. ddlkit follows each job with
`scontrol show job` every `compute.poll_interval_s`; no accounting database (`sacct`) is needed.

    ddlkit compute=slurm compute.nodes=2 compute.procs_per_node=4 compute.gpus_per_node=4 \
        compute.partition=gpu compute.time=04:00:00 dist=native
    ddlkit plan compute=slurm compute.nodes=2 compute.procs_per_node=4 dist=native    # prints the batch script
    ddlkit -m optimizer.lr=0.1,0.05 compute=slurm sweep.max_parallel=8                # one Slurm job per sweep job
    ddlkit jobs status|logs|attach|cancel JOB                                         # from any shell

Status: works; tested on a real Slurm (single-node and two-node clusters on one machine,
`scripts/local_slurm.sh`).

## The batch script

`slurm.sbatch` in the job directory (what `ddlkit plan` prints) is submitted with
`sbatch --parsable --chdir=<job dir> --export=ALL slurm.sbatch`. It

1. sets `MASTER_ADDR` (the allocation's first node's `NodeAddr`, its name on most clusters),
   `MASTER_PORT` (20000 + 2 x (job id mod 20000)) and ddlkit's control-plane address (the next
   port);
2. runs `srun --kill-on-bad-exit=1 python -m ddlkit_slurm.rank -- python -m ddlkit.rank.worker job.json`.
   The rank entry turns Slurm's `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`/`SLURM_NODEID` into
   `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` and ddlkit's node layout, and runs the
   worker under ddlkit's rank minder: each rank's output goes to `rank-N.log`, rank 0's also to
   the batch output `slurm.log` (which `ddlkit` streams and `ddlkit jobs logs` shows), where the
   other ranks' error lines and a failing rank's last lines land too, prefixed `[rank N]`;
3. on the time-limit warning (below) sends SIGTERM to the ranks and re-queues the job;
4. writes `.ddlkit/slurm-exit.json` (the ranks' exit status) when it ends without re-queueing.

The job's environment travels in sbatch's environment; its secrets do not, since Slurm keeps a
submitted job's environment in its state directory. They are in `.ddlkit/secrets.json` in the job
directory, readable by you alone, which each rank's wrapper reads and the batch script removes
when the job is over (a re-queued job keeps it). The script names them, never their values.

## Time limits, preemption and cancel

The job asks for a warning `compute.signal_before_s` before its limit (`--signal=B:USR1@120`). On
it the ranks checkpoint at their next step and exit 75, and the job re-queues itself
(`scontrol requeue`: same job id), at most `compute.max_requeues` times; its next run resumes
from the checkpoint in the same directory (`trainer.resume=auto`). After the last re-queue the
job ends with status 75 ("stopped after saving a checkpoint", with the command that resumes it).
A job that ran out of time without a checkpoint fails saying so.

A cancel (Ctrl-C, `ddlkit jobs cancel`, a sweep's fail-fast) writes the cancel marker and sends
`SIGUSR1` to the batch shell only (`scancel --signal=USR1 --batch`): the ranks get SIGTERM and
checkpoint, and the job ends after `compute.grace_period_s`. A pending job is simply `scancel`ed.
A plain `scancel JOB` (or a preemption that sends SIGTERM to every process of the job) also
reaches `srun`, which kills the ranks at once, without a checkpoint; `scancel --signal=USR1
--batch JOB` checkpoints and re-queues, as the time-limit warning does.

## Failures

A failed job is judged by the rank that failed first, as on `compute=local_mpi`: each rank's exit
record (in the shared job directory, from every node) says how and when it ended, and the report
names that rank, its node and host, its exit status and its log's last lines. srun's own status
(the batch job's `ExitCode`) is that of whichever task it reports (often a peer that srun stopped
after the failure: 75, 76, SIGTERM) and is used only when no rank left a record. So an exception
in rank 0 is never restarted, and a rank killed from outside is
([Failures, restarts and elastic jobs](../failures.md)).

Errors (one line, exit status 2): no `sbatch` on `PATH` (run on a login node), no Slurm
configuration (export `SLURM_CONF`, or start the local cluster below), an unknown partition (the
ones `sinfo` reports are listed), more nodes than the partition (the given one or the cluster's
default) has, a time limit Slurm does not read, `sbatch` refusing the job (Slurm's own message),
and a job Slurm keeps queued that can never start (`PartitionNodeLimit`, `PartitionTimeLimit`,
`PartitionConfig`, `BadConstraints`): ddlkit cancels it and names the setting to change.

Waiting is not silent: until a job's first output, the launcher prints its state and Slurm's
reason once it has been quiet for 3 s, then on each change
(`ddlkit: job pending (Slurm: PENDING, reason Resources), no output yet`).

## A real Slurm on this machine

For the tests and for trying it out (root; Debian's packages):

    apt-get install -y slurmctld slurmd slurm-client munge
    scripts/local_slurm.sh start        # idempotent; prints: export SLURM_CONF=/tmp/ddlkit-slurm/slurm.conf
    export SLURM_CONF=/tmp/ddlkit-slurm/slurm.conf
    scripts/local_slurm.sh status | stop
    DDLKIT_SLURM_NODES=2 DDLKIT_SLURM_DIR=/tmp/ddlkit-slurm-2nodes DDLKIT_SLURM_PORT=7817 scripts/local_slurm.sh start

The last starts a second cluster beside the first, of two nodes (`<host>-1`, `<host>-2`: two
`slurmd` on this machine, the controller on port 7817 and the nodes on the next ones), which the
elastic tests drain and resume (`scontrol update NodeName=<host>-2 State=DRAIN|RESUME`). The
script generates a munge key if there is none, starts `munged` as the `munge` user, and runs
`slurmctld` and `slurmd` with their config, state, spool and logs under `/tmp/ddlkit-slurm`
(`$DDLKIT_SLURM_DIR`). What differs from a production cluster: one node (`hostname -s`) that
declares 8 CPUs (`$DDLKIT_SLURM_CPUS`) on a 2-core machine (`SlurmdParameters=config_overrides`)
so multi-rank jobs queue and run; no cgroups (`ProctrackType=proctrack/linuxproc`,
`TaskPlugin=task/none`, `JobAcctGatherType=jobacct_gather/none`): nothing confines a job to its
CPUs or memory; no accounting database (`sacct` does not work); daemons run as root; partitions
`debug` (default) and `batch`; a re-queued job may start again after 10 s
(`AuthInfo=cred_expire=10`; Slurm's default, usual on clusters, is 120 s) and the scheduler runs
every 2 s (`sched_interval=2`), so the queue answers in seconds where a busy cluster takes minutes.

The plugin's tests submit real jobs to the cluster `$SLURM_CONF` names, else to this one; without
either they skip, saying why:

    scripts/local_slurm.sh start && export SLURM_CONF=/tmp/ddlkit-slurm/slurm.conf
    cd plugins/ddlkit-slurm && python -m pytest -q            # -m "not slow" for the quick ones

## How it works

A job is the core's `ddlkit.compute.scheduler.SchedulerJob` over `SlurmScheduler`, which says
what Slurm sees: the script's exit record (`EXIT_RECORD`: srun's exit code, the job id, the
restarts), a file in the job directory read on every look, else `scontrol show job`:
`PENDING`/`REQUEUED` -> pending (with Slurm's reason), `RUNNING`/`COMPLETING` -> running,
`TIMEOUT` -> failed, "ran out of time". Slurm is asked at most once per `compute.poll_interval_s`,
however often the handle's status is asked, so the end of a job is seen at once while the
scheduler is asked a few times a minute, also after Slurm forgot the job. A watcher (the sweep
scheduler) may therefore look every half second (`SlurmTarget.status_interval_s`). How the job
ended (the rank that failed first, a checkpoint before the end) `ddlkit.compute.outcome.judge`
decides from the ranks' exit records, as for every target. The secrets file is
`ddlkit.compute.secret_file.SECRETS_FILE` (mode 0600). Only `srun` starts the ranks for now
(`compute.launcher`); for mpirun inside an allocation use `compute=mpi` in your own batch script.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ddlkit
from ddlkit.atomic import write_text
from ddlkit.compute import secret_file
from ddlkit.compute.gang import ElasticGangConfig
from ddlkit.compute.layout import CONTROL_ADDR_ENV, CONTROL_PORT_SHELL
from ddlkit.compute.outcome import Observation
from ddlkit.compute.process import LogFollower
from ddlkit.compute.scheduler import Scheduler, SchedulerJob
from ddlkit.interfaces import JobHandle, JobSpec, JobState
from ddlkit.jobdir import CANCEL_FILE, EXIT_CONFIG_ERROR, EXIT_PREEMPTED, RANKS_DIR, STATE_DIR
from ddlkit.options import NON_NEGATIVE, POSITIVE, POSITIVE_INTEGER, checked

#: the batch script, written into the job directory
SCRIPT = "slurm.sbatch"
#: the batch job's output: what the script says plus rank 0's output (followed by logs())
OUTPUT = "slurm.log"
#: the script's record of how the job ended (relative to the job directory)
EXIT_RECORD = f"{STATE_DIR}/slurm-exit.json"
#: the script's record of how the ranks ended when Slurm stopped the job (time limit, scancel, preemption)
STOP_RECORD = f"{STATE_DIR}/slurm-stopped.json"
RANK_MODULE = "ddlkit_slurm.rank"
#: Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds; and the unlimited ones
_TIME = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+|unlimited|infinite)$", re.IGNORECASE)
_PENDING = {
    "PENDING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "RESV_DEL_HOLD",
    "SUSPENDED",
    "STOPPED",
    "RESIZING",
}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
#: reasons a job stays PENDING that no wait resolves (the job asks for more than its partition has
#: or allows, and the cluster does not refuse it at sbatch: EnforcePartLimits=NO), with the fix
_NEVER_STARTS = {
    "PartitionNodeLimit": "it asks for more nodes than its partition has or allows: lower compute.nodes, or choose "
    "another compute.partition (sinfo lists them)",
    "PartitionTimeLimit": "its time limit is above its partition's: lower compute.time, or choose another "
    "compute.partition (sinfo -o '%P %l' lists their limits)",
    # what Slurm says first of any of the above
    "PartitionConfig": "it asks for more than its partition has or allows: lower compute.nodes, compute.time, "
    "compute.procs_per_node, compute.cpus_per_task, compute.gpus_per_node or compute.mem, or choose "
    "another compute.partition (sinfo -o '%P %D %l %c %m' shows what each has)",
    "BadConstraints": "no node satisfies its constraints: check compute.constraint, compute.gpus_per_node, "
    "compute.cpus_per_task and compute.mem",
}
#: the node states (sinfo's %t) in which Slurm gives a node to a job that asks for it now or soon
_USABLE = {"idle", "mix", "alloc", "comp", "plnd", "resv"}
#: what sinfo, scontrol and sbatch say when they find no slurm.conf (nor a DNS SRV record naming one)
_NO_CONFIG = "configuration source"

#: scheduler commands run by this process (sbatch, scontrol, scancel, sinfo): what the benchmark counts
SCHEDULER_CALLS = {"count": 0}


@dataclass
class SlurmConfig(ElasticGangConfig):
    # nodes of the allocation, and ranks (Slurm tasks) per node; the job has nodes x procs_per_node ranks
    nodes: int = checked(1, POSITIVE_INTEGER)
    # elastic: after losing nodes, a restart asks for the nodes of the partition that are up (sinfo) if at
    # least this many, and for all of compute.nodes again once they are back (null: nodes, not elastic)
    min_nodes: int | None = checked(None, POSITIVE_INTEGER)
    # the partition, checked against sinfo before submitting (null: the cluster's default)
    partition: str | None = None
    # the time limit, in Slurm's formats (minutes, HH:MM:SS, D-HH:MM:SS, ...); null: the partition's
    time: str | None = None
    # GPUs per node (--gpus-per-node), CPUs per rank (--cpus-per-task; also the ranks' OMP_NUM_THREADS),
    # memory per node (--mem, e.g. 64G)
    gpus_per_node: int | None = checked(None, NON_NEGATIVE)
    cpus_per_task: int | None = checked(None, NON_NEGATIVE)
    mem: str | None = None
    # the account to charge (--account), the quality of service (--qos), node features (--constraint)
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    # extra batch options, one per entry, e.g. ["--exclusive", "--reservation=demo"]
    extra_sbatch: list[str] = field(default_factory=list)
    # the ranks' interpreter on the nodes; null: this one (sys.executable)
    python: str | None = None
    # seconds before the time limit at which Slurm warns the job (it checkpoints and re-queues
    # itself); 0: no warning. Slurm may send it up to a minute early
    signal_before_s: int = checked(120, NON_NEGATIVE)
    # how often a job that checkpointed on the warning (or a preemption) re-queues itself to resume
    max_requeues: int = checked(3, NON_NEGATIVE)
    # seconds between looks at the queue (scontrol show job) per job; the job's end is seen at once
    # (from its exit record in the job directory)
    poll_interval_s: float = checked(5.0, POSITIVE)
    # seconds a cancelled job gets to checkpoint before Slurm kills it
    grace_period_s: float = checked(30.0, NON_NEGATIVE)
    # what starts the ranks inside the allocation: srun
    launcher: str = "srun"


def _run(args: list[str], *, env: Mapping[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    SCHEDULER_CALLS["count"] += 1
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise ddlkit.ConfigError(
            f"compute=slurm needs Slurm's `{args[0]}` on PATH: run ddlkit on a Slurm login "
            "node (or start a local cluster with scripts/local_slurm.sh start)."
        ) from None
    except subprocess.TimeoutExpired:
        raise ddlkit.ConfigError(
            f"`{shlex.join(args[:3])}` did not answer within {timeout:.0f} s: "
            "is the Slurm controller up (scontrol ping)?"
        ) from None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return "; ".join(lines[:3]) if lines else "(no message)"


def _failed(what: str, proc: subprocess.CompletedProcess) -> ddlkit.ConfigError:
    """A Slurm command's failure; one that finds no cluster configuration says how to give one
    (Slurm's own words are a DNS lookup's)."""
    text = proc.stderr or proc.stdout
    if _NO_CONFIG in text:
        return ddlkit.ConfigError(
            f"{what} finds no Slurm configuration: export SLURM_CONF=<path to slurm.conf> (for "
            'the local cluster: eval "$(bash scripts/local_slurm.sh start)").'
        )
    return ddlkit.ConfigError(f"{what} failed: {_first_line(text)}")


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` output: ``Key=Value`` pairs (values without spaces but Command's)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


# ---------------------------------------------------------------------------- the scheduler
class SlurmScheduler(Scheduler):
    """What Slurm says of one ddlkit batch job, whose directory (``job_dir``, on the shared disk)
    holds its batch output and the script's records; how it ended, :func:`ddlkit.compute.outcome.judge`
    decides."""

    noun = "Slurm job"
    #: what the batch shell takes to pass a stop (SIGUSR1) on to the ranks
    kill_slack_s = 5.0

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = Path(job_dir)
        self._log, self._read = LogFollower(self.job_dir / OUTPUT, pace_s=0.1), 0

    def _record(self, name: str, job_id: str) -> dict | None:
        """One of the batch script's records (``EXIT_RECORD``, ``STOP_RECORD``), if it is this job's."""
        try:
            record = json.loads((self.job_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if str(record.get("job_id")) == job_id else None

    def look(self, job_id: str) -> Observation | None:
        """The script's exit record: how srun ended, read on every look (a file in the job
        directory), so the end is seen at once while Slurm is asked a few times a minute. Ranks that
        a signal ended (srun's status above 128) wait for Slurm's word: its time limit may have come,
        and the script's record be written before its own signal arrives."""
        record = self._record(EXIT_RECORD, job_id)
        return None if record is None or int(record["code"]) > 128 else self._ended(record)

    @staticmethod
    def _ended(record: dict) -> Observation:
        code = int(record["code"])
        if code == 0:
            return Observation(JobState.SUCCEEDED, 0)
        requeued = f"stopped after {record.get('restarts', 0)} re-queue(s), the most compute.max_requeues allows"
        return Observation(JobState.FAILED, code, requeued if code == EXIT_PREEMPTED and record.get("warned") else "")

    def query(self, job_id: str) -> dict[str, str] | None:
        """Slurm's view of the job (``scontrol show job``); None when Slurm no longer knows it."""
        proc = _run(["scontrol", "show", "job", "-o", job_id])
        if proc.returncode != 0:
            if "invalid job id" in (proc.stderr + proc.stdout).lower():
                return None
            raise _failed(f"scontrol show job {job_id}", proc)
        return parse_scontrol(proc.stdout)

    def describe(self, job_id: str) -> Observation:
        info = self.query(job_id)
        record = self._record(EXIT_RECORD, job_id)  # the job may have ended while Slurm was asked
        state, reason = ("", "") if info is None else (info.get("JobState", ""), info.get("Reason", ""))
        timed_out = state == "TIMEOUT" or reason == "TimeLimit" and record is not None
        if record is not None and not (int(record["code"]) > 128 and (timed_out or state == "CANCELLED")):
            return self._ended(record)  # else Slurm's time limit or scancel killed the ranks: it says so
        if info is None:
            gone = f"left no exit record in {self.job_dir / EXIT_RECORD}: Slurm no longer knows job {job_id}"
            return Observation(JobState.FAILED, reason=gone)
        if state == "PENDING" and reason in _NEVER_STARTS:  # Slurm would keep it queued, silently, for ever
            _run(["scancel", job_id])
            why = f"can never start ({reason}): {_NEVER_STARTS[reason]}; it was cancelled"
            return Observation(JobState.FAILED, EXIT_CONFIG_ERROR, why, started=False)
        if state in _PENDING:
            return Observation(JobState.PENDING, reason=f"Slurm: {state}, reason {reason}")
        if state in _RUNNING and not timed_out:
            return Observation(JobState.RUNNING, reason=f"Slurm: {state} on {info.get('NodeList', '?')}")
        if state == "COMPLETED":
            return Observation(JobState.SUCCEEDED, 0)
        # the ranks' status when Slurm stopped the job (time limit, scancel, preemption), else the batch job's
        stopped = record or self._record(STOP_RECORD, job_id)
        code, _, sig = info.get("ExitCode", "0:0").partition(":")
        exit_code = -int(sig) if sig.isdigit() and int(sig) else int(code) if code.isdigit() else None
        exit_code = int(stopped["code"]) if stopped is not None else exit_code
        if state == "CANCELLED":
            return Observation(JobState.CANCELLED, exit_code, f"was cancelled ({reason})")
        if timed_out:
            return Observation(
                JobState.FAILED,
                exit_code,
                f"ran out of time (time limit {info.get('TimeLimit', '?')})",
                unless_saved="without saving a checkpoint: raise compute.time, or compute.signal_before_s so that "
                "the warning comes while the job can still checkpoint",
            )
        return Observation(JobState.FAILED, exit_code, f"ended {state} ({reason})")

    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        if how == "kill":
            _run(["scancel", job_id])
            return
        # SIGUSR1 to the batch shell only (srun itself must not get SIGTERM: it would kill the ranks at
        # once): seeing the cancel mark, it passes SIGTERM to the ranks, which checkpoint, and ends the
        # job after the grace period by itself (also when this process is gone)
        if _run(["scancel", "--signal=USR1", "--batch", job_id]).returncode != 0:
            info = self.query(job_id)  # a job still queued has no batch shell: it is removed
            if info is not None and info.get("JobState") in _PENDING:
                _run(["scancel", job_id])

    def read_log(self, job_id: str, offset: int) -> str:
        """The batch output (the script's lines and rank 0's output), read on from where the last
        read stopped (decoded across reads)."""
        if offset < self._read:
            self._log, self._read = LogFollower(self.job_dir / OUTPUT, pace_s=0.1), 0
        start = self._read
        text = self._log.read_new()
        self._read += len(text)
        return text[offset - start :]


# ---------------------------------------------------------------------------- the target
class SlurmTarget(ddlkit.ComputeTarget):
    """``compute=slurm``: a batch job of ``nodes`` x ``procs_per_node`` ranks."""

    cfg: SlurmConfig
    # the job directory is on the cluster's shared file system, where the ranks run
    shares_job_dir = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        c = cfg
        if c.time is not None and not _TIME.match(str(c.time)):
            raise ddlkit.ConfigError(
                f"compute.time={c.time} is not a Slurm time limit: use minutes (90), HH:MM:SS (04:00:00), "
                "D-HH:MM:SS (1-12:00:00), D-HH, MM:SS or UNLIMITED."
            )
        if c.launcher != "srun":
            raise ddlkit.ConfigError(
                f"compute.launcher={c.launcher} is not supported: compute=slurm starts its ranks "
                "with srun (for mpirun inside an allocation, run compute=mpi in a batch job)."
            )
        for line in c.extra_sbatch:
            if not str(line).strip().lstrip("#").replace("SBATCH", "", 1).strip().startswith("-"):
                raise ddlkit.ConfigError(
                    f"compute.extra_sbatch entry {line!r} is not a batch option: write it as "
                    "sbatch takes it, e.g. --exclusive or --reservation=demo."
                )
        #: the handle asks Slurm once per compute.poll_interval_s and reads the exit record in between,
        #: so watchers may look often: a sweep sees a job's end within half a second
        self.status_interval_s = min(0.5, float(c.poll_interval_s))

    @property
    def ranks_share_environment(self) -> bool:
        # compute.python names another interpreter (a cluster's venv, a container's wrapper)
        return not self.cfg.python

    def python(self) -> str:
        return self.cfg.python or sys.executable

    # ------------------------------------------------------------ the batch script
    def sbatch_options(self, spec: JobSpec) -> list[str]:
        c = self.cfg
        opts = [
            f"--job-name={spec.name}",
            f"--nodes={c.nodes}",
            f"--ntasks-per-node={c.procs_per_node}",
            f"--output={OUTPUT}",
            "--open-mode=append",
            "--requeue",
        ]
        for key, flag in (
            ("partition", "partition"),
            ("time", "time"),
            ("gpus_per_node", "gpus-per-node"),
            ("cpus_per_task", "cpus-per-task"),
            ("mem", "mem"),
            ("account", "account"),
            ("qos", "qos"),
            ("constraint", "constraint"),
        ):
            value = getattr(c, key)
            if value is not None and value != "":
                opts.append(f"--{flag}={value}")
        if c.signal_before_s:
            # B: to the batch shell only, which decides: checkpoint the ranks, then re-queue
            opts.append(f"--signal=B:USR1@{int(c.signal_before_s)}")
        for line in c.extra_sbatch:
            opts.append(str(line).strip().removeprefix("#SBATCH").strip())
        return opts

    def script(self, spec: JobSpec) -> str:
        c = self.cfg
        python = self.python()
        rank_cmd = shlex.join([python, "-m", RANK_MODULE, "--", *spec.command(python)])
        header = "\n".join(f"#SBATCH {o}" for o in self.sbatch_options(spec))
        env_names = ", ".join(sorted(spec.env)) or "(none)"
        secret_names = ", ".join(sorted(spec.secret_env)) or "(none)"
        return f"""#!/bin/bash
# ddlkit job {spec.name}: {self.world_size} rank(s) on {c.nodes} node(s), written by compute=slurm.
# sbatch runs it with the job directory as working directory (--chdir) and passes the launcher's
# environment (--export=ALL), which holds the job's variables: {env_names}
# Its secrets ({secret_names}) are in {secret_file.SECRETS_FILE}, readable by the job's user alone, which
# the ranks read and this script removes when the job is over (not when it is re-queued).
{header}

set -u
mkdir -p {STATE_DIR}
rm -rf {EXIT_RECORD} {STOP_RECORD} {RANKS_DIR}  # a re-queued run's records are its own
restarts=${{SLURM_RESTART_COUNT:-0}}
max_requeues={int(c.max_requeues)}
grace={int(c.grace_period_s)}
# the rendezvous: rank 0 runs on the allocation's first node, at the address Slurm reaches it by
# (NodeAddr: its name on most clusters); the port follows from the job id
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first_node" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | head -n 1 | cut -d= -f2)
MASTER_ADDR=${{MASTER_ADDR:-$first_node}}
MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000 * 2))
export MASTER_ADDR MASTER_PORT {CONTROL_ADDR_ENV}="$MASTER_ADDR:{CONTROL_PORT_SHELL}" PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-${{SLURM_CPUS_PER_TASK:-1}}}}
echo "ddlkit-slurm: job $SLURM_JOB_ID (run $((restarts + 1))) on $SLURM_JOB_NODELIST: {self.world_size} rank(s)"
if [ -e {CANCEL_FILE} ] && [ "$restarts" -gt 0 ]; then
    echo "ddlkit-slurm: the job was cancelled; not resuming it"; rm -f {secret_file.SECRETS_FILE}; exit {EXIT_PREEMPTED}
fi

warned=0 stopping=0 signalled=0
stop_ranks() {{  # SIGTERM to every rank (the job's steps, not this shell nor srun): they checkpoint
    scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
}}
on_stop() {{  # ddlkit's cancel, or a preemption: checkpoint, then end (within the grace period)
    signalled=1
    [ "$stopping" = 1 ] && return
    stopping=1
    echo "ddlkit-slurm: stop requested: the ranks checkpoint and stop (at most ${{grace}} s)"
    stop_ranks
    (sleep "$grace"; echo "ddlkit-slurm: the ranks did not stop within ${{grace}} s"; scancel "$SLURM_JOB_ID") &
}}
on_usr1() {{  # Slurm's warning before the time limit (--signal=B:USR1), or ddlkit's cancel
    signalled=1
    if [ -e {CANCEL_FILE} ]; then on_stop; return; fi
    [ "$warned" = 1 ] && return
    warned=1
    echo "ddlkit-slurm: warning signal (time limit near): the ranks checkpoint and stop"
    stop_ranks
}}
trap on_usr1 USR1
trap on_stop TERM INT

srun --kill-on-bad-exit=1 --ntasks={self.world_size} {rank_cmd} &
srun_pid=$!
code=1
while :; do
    signalled=0
    wait "$srun_pid"; c=$?
    [ "$c" -eq 127 ] && break
    code=$c
    [ "$signalled" = 1 ] || break
done

if [ "$code" -eq {EXIT_PREEMPTED} ] && [ "$warned" = 1 ] && [ "$stopping" = 0 ] && [ ! -e {CANCEL_FILE} ] \\
        && [ "$restarts" -lt "$max_requeues" ]; then
    echo "ddlkit-slurm: checkpoint saved; re-queueing the job to resume ($((restarts + 1)) of $max_requeues)"
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0
    fi
    echo "ddlkit-slurm: scontrol requeue failed"
fi
if [ "$stopping" = 1 ] && [ ! -e {CANCEL_FILE} ]; then
    # Slurm ended the job (time limit, scancel, preemption): its state says how; this says
    # whether the ranks saved a checkpoint first (exit {EXIT_PREEMPTED})
    echo "ddlkit-slurm: stopped by Slurm; the ranks ended with exit status $code"
    printf '{{"job_id": "%s", "code": %d, "restarts": %d}}\\n' "$SLURM_JOB_ID" "$code" "$restarts" > {STOP_RECORD}.tmp
    mv {STOP_RECORD}.tmp {STOP_RECORD}
    exit "$code"
fi
echo "ddlkit-slurm: the ranks ended with exit status $code"
printf '{{"job_id": "%s", "code": %d, "restarts": %d, "warned": %d, "time": %d}}\\n' \\
    "$SLURM_JOB_ID" "$code" "$restarts" "$warned" "$(date +%s)" > {EXIT_RECORD}.tmp
mv {EXIT_RECORD}.tmp {EXIT_RECORD}
rm -f {secret_file.SECRETS_FILE}  # the job is over (a stop by Slurm keeps them: Slurm may re-queue it)
exit "$code"
"""

    def sbatch_command(self, spec: JobSpec, job_dir: Path | str) -> list[str]:
        return ["sbatch", "--parsable", f"--chdir={job_dir}", "--export=ALL", SCRIPT]

    def plan(self, spec: JobSpec) -> str:
        return f"# {shlex.join(self.sbatch_command(spec, spec.job_dir))}   (in {spec.job_dir})\n" + self.script(spec)

    # ------------------------------------------------------------ elastic
    def nodes_up(self, spec: JobSpec) -> int | None:
        """The nodes of the job's partition that Slurm would give a job now: those whose state is
        idle, mixed, allocated (to other jobs: the job queues for them) or completing, not down,
        drained, failing or not responding."""
        partition = self.cfg.partition
        for attempt in range(3):  # a controller busy with the job that just ended may not answer at once
            proc = _run(["sinfo", "-h", "-o", "%P %D %t", *(["-p", partition] if partition else [])])
            if proc.returncode == 0:
                break
            time.sleep(1 + attempt)
        else:
            return None  # it cannot tell now: the job restarts on all its nodes
        up = 0
        for line in proc.stdout.splitlines():
            name, count, state = (line.split() + ["", "", ""])[:3]
            if partition is None and not name.endswith("*"):
                continue  # another partition than the cluster's default
            # a trailing * is a node that does not respond; ~ (powered down) and # (powering up) start on demand
            if state.rstrip("~#!%$@^-") in _USABLE and count.isdigit():
                up += int(count)
        return up

    # ------------------------------------------------------------ checks against the cluster
    def check_cluster(self) -> None:
        c = self.cfg
        if shutil.which("sbatch") is None:
            raise ddlkit.ConfigError(
                "compute=slurm needs Slurm's `sbatch` on PATH: run ddlkit on a Slurm login node "
                "(or start a local cluster with scripts/local_slurm.sh start)."
            )
        # %P marks the default partition with a '*'; a partition has a line per state of its nodes
        proc = _run(["sinfo", "-h", "-o", "%P %D"])
        if proc.returncode != 0:
            raise _failed("sinfo", proc)
        partitions: dict[str, int] = {}
        default = None
        for line in proc.stdout.splitlines():
            if line.split():
                name, count = line.split()[0], line.split()[-1]
                if name.endswith("*"):
                    name = default = name[:-1]
                partitions[name] = partitions.get(name, 0) + (int(count) if count.isdigit() else 0)
        if c.partition is not None and c.partition not in partitions:
            raise ddlkit.ConfigError(
                f"compute.partition={c.partition} is not a partition of this cluster; sinfo "
                f"reports: {', '.join(sorted(partitions)) or '(none)'}."
            )
        partition = c.partition if c.partition is not None else default
        if partition is not None and c.nodes > partitions[partition]:
            larger = sorted(p for p, n in partitions.items() if n >= c.nodes)
            raise ddlkit.ConfigError(
                f"compute.nodes={c.nodes} asks for more nodes than partition {partition} has ({partitions[partition]})"
                + ("" if c.partition is not None else ", the cluster's default")
                + ": lower compute.nodes"
                + (f", or choose compute.partition={' or '.join(larger)}." if larger else ".")
            )

    # ------------------------------------------------------------ ComputeTarget
    def submit(self, spec: JobSpec) -> JobHandle:
        self.check_cluster()
        job_dir = Path(spec.job_dir).resolve()
        (job_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
        # a resumed job runs in the same directory: the previous run's ending is not this one's (the
        # script removes the ranks' records too, but a job may end before its script runs)
        for name in (EXIT_RECORD, STOP_RECORD, CANCEL_FILE):
            (job_dir / name).unlink(missing_ok=True)
        shutil.rmtree(job_dir / RANKS_DIR, ignore_errors=True)
        write_text(job_dir / SCRIPT, self.script(spec))
        # the secrets in a file of the user's alone, never in sbatch's environment: Slurm keeps that in its spool
        secret_file.write(job_dir, spec.secret_env)
        env = {**os.environ, **spec.env}
        proc = _run(self.sbatch_command(spec, job_dir), env=env)
        job_id = proc.stdout.strip().split(";")[0]
        if proc.returncode != 0 or not job_id.isdigit():
            raise ddlkit.ConfigError(f"sbatch refused the job: {_first_line(proc.stderr or proc.stdout)}")
        return self.attach(job_id, job_dir=job_dir)

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        if not str(job_id).isdigit():
            raise ddlkit.ConfigError(f"{job_id!r} is not a Slurm job id.")
        job_dir = Path(job_dir).resolve()
        return SchedulerJob(
            SlurmScheduler(job_dir),
            str(job_id),
            job_dir=job_dir,
            world_size=self.world_size,
            poll_interval_s=self.cfg.poll_interval_s,
            grace_period_s=self.cfg.grace_period_s,
            log=job_dir / OUTPUT,
        )
