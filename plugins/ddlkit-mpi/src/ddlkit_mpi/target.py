r"""Two compute targets that start a job's ranks with OpenMPI's `mpirun` (one implementation):

- `compute=local_mpi`: a cluster on one machine, `compute.nodes` simulated nodes of
  `compute.procs_per_node` ranks each, so that everything a cluster job does (rendezvous,
  gradient all-reduce, rank-0-only duties, per-node staging, a rank dying, preemption) runs and
  can be tried here;
- `compute=mpi`: one job across real hosts, named by `compute.hosts`, `compute.hostfile`, or the
  allocation of the cluster scheduler it runs under. It is what runs *inside* a cluster job.

The job directory and the job file are the same for both, and the same ones any other target runs.

    apt-get install -y openmpi-bin            # mpirun (libopenmpi-dev too, to build Horovod)

    ddlkit compute=local_mpi compute.nodes=2 compute.procs_per_node=2 dist=native
    ddlkit compute=mpi compute.hosts=[node1:4,node2:4] dist=native          # 8 ranks on 2 hosts
    ddlkit compute=mpi compute.hostfile=<hostfile> dist=native
    ddlkit plan compute=mpi compute.hosts=[node1:4,node2:4] dist=native     # print the mpirun command; run nothing

A job of several ranks needs a `dist` backend to share gradients
([Distributed training](../distributed.md)).

## compute=local_mpi: a cluster on one machine

Each simulated node has its own node id, local ranks and local scratch directory
(`<job_dir>/nodes/node-K`, or below `compute.scratch`), exported to its ranks as `DDLKIT_NODE`,
`DDLKIT_LOCAL_RANK`, `DDLKIT_LOCAL_SIZE` and `DDLKIT_NODE_SCRATCH`, and seen by plugins as
`run.dist.node`, `run.dist.local_rank` and `run.dist.node_scratch`: per-node duties (local rank 0
stages the data onto its node's disk with [storage=local_ssd](../storage/local_ssd.md)) run as
they do on a cluster. Every rank keeps its output in `rank-N.log`, and a dying rank ends the job
within seconds.

mpirun runs with `PMIX_MCA_psec=native` (unless you set it): where munge is installed (Slurm's
packages) but its daemon is not running, OpenMPI's PMIx otherwise retries it for 2 s at every
start and restart.

Status: works; the distributed, restart and elastic tests run on it.

## compute=mpi: where the hosts come from

First match wins:

1. `compute.hosts=[a:4,b:4]`;
2. `compute.hostfile=FILE`, in OpenMPI's syntax: one `host [slots=N] [max_slots=M]` per line, `#`
   comments and blank lines; a host on several lines adds up its slots (a line without `slots`
   is one slot);
3. `$AZ_BATCHAI_MPI_HOST_FILE`, the hostfile Azure Batch AI writes for an MPI job;
4. `$AZ_BATCH_HOST_LIST`, Azure Batch's multi-instance task hosts (`ip,ip,...`; slots from
   `compute.procs_per_node`);
5. `$PBS_NODEFILE`, PBS/Torque's node file, one line per slot;
6. `$SLURM_JOB_NODELIST` (or `$SLURM_NODELIST`), a Slurm allocation such as `gpu[01-04,07]`,
   expanded by ddlkit (what `scontrol show hostnames` prints), its slots from
   `$SLURM_NTASKS_PER_NODE` or `$SLURM_TASKS_PER_NODE` (`4(x2),2`).

With none of them, the run stops before anything starts (exit status 2) with one line naming
every place it looked. So do a hostfile that does not exist, a bad hostfile line (the file and
the line number are named), and more ranks than the hosts have slots.

## What a cluster job runs

Inside the job the scheduler starts on its first node, in the job directory on a file system
every host mounts at the same path:

    ddlkit compute=mpi dist=native framework=pytorch ...          # hosts from the scheduler

which runs (`ddlkit plan` prints it exactly; the working directory is the job directory):

    mpirun -np 8 -H node1:4,node2:4 --bind-to none --map-by slot \
        -x MASTER_ADDR -x MASTER_PORT -x DDLKIT_CONTROL_ADDR -x PYTHONUNBUFFERED -x OMP_NUM_THREADS \
        -x DDLKIT_PLUGINS ... <compute.mpirun_args> \
        /usr/bin/python3 -m ddlkit_mpi.rank --job-dir . --node-sizes 4,4 --scratch nodes \
        --cancel-file .ddlkit/cancel-requested -- /usr/bin/python3 -m ddlkit.rank.worker job.json

Every host's ranks run in the job directory (mpirun's working directory; a rank on a host where
that directory does not exist stops with an error saying so). The environment the job needs
(which plugins to load, the storage account, ...) and its secrets travel by name (`-x NAME`):
their values are in mpirun's environment, never on a command line, in `ddlkit plan` or in a file.
OpenMPI starts its daemons on the other hosts through `ssh` (its `rsh` launcher): passwordless
ssh between the nodes, as cluster images set up, or another agent with
`compute.mpirun_args=[--mca,plm_rsh_agent,...]`. When mpirun's own host is in the list, OpenMPI
places the first ranks there whatever the order given, so ddlkit lists it first (`ddlkit plan`
shows the order used): rank 0 is on the first host of the command line. Other useful
`compute.mpirun_args`: `[-q]` hides mpirun's banners, `[--mca,btl_tcp_if_include,eth0]` picks the
network, `[--prefix,/opt/openmpi]` names OpenMPI's location on the hosts.

Status: works; tested with this machine named twice in a hostfile (a 4-rank job, the "other
host" reached through an ssh stand-in in a bare environment).

## What each rank gets

`mpirun` starts `python -m ddlkit_mpi.rank` per rank (`--oversubscribe` for `local_mpi`, exactly
the hosts' ranks for `mpi`), which runs the worker under ddlkit's rank minder (logs, console,
exit records, signals, no orphans: [Write a compute target](../../plugins/write-a-compute-target.md))
with

- `DDLKIT_NODE`, `DDLKIT_LOCAL_RANK`, `DDLKIT_LOCAL_SIZE`, preferred by `ddlkit.DistContext`
  over anything else. `local_mpi`: the simulated layout (rank r is local rank
  `r % procs_per_node` of node `r // procs_per_node`). `mpi`: OpenMPI's own
  `OMPI_COMM_WORLD_LOCAL_RANK` and `OMPI_COMM_WORLD_LOCAL_SIZE`; the node is the index of the
  rank's host in the command line's `-H` list. OpenMPI exports no node index
  (`OMPI_COMM_WORLD_NODE_RANK` is a rank *within* the node), so it follows from `--map-by slot`
  filling host after host (`--node-sizes`): a `--map-by` of your own in `compute.mpirun_args`
  breaks that for uneven hosts;
- `DDLKIT_NODE_SCRATCH`: `<compute.scratch>/node-K`, created by the rank, where
  `storage=local_ssd` stages data when `storage.scratch` is not set;
- `MASTER_ADDR`, `MASTER_PORT` (torch.distributed's rendezvous) and `DDLKIT_CONTROL_ADDR`
  (ddlkit's control plane). `local_mpi`: `127.0.0.1` and free loopback ports chosen per job,
  `GLOO_SOCKET_IFNAME=lo`. `mpi`: the first host, `compute.master_port` and the port after it (a
  first host named `localhost` while other hosts take part is replaced by this machine's name);
- `OMP_NUM_THREADS` = cores / ranks per node unless set; `OMPI_ALLOW_RUN_AS_ROOT*` when running
  as root (containers); `local_mpi` also `OMPI_MCA_mpi_yield_when_idle=1` (a rank waiting in an
  MPI collective yields its core instead of busy-polling: twice Horovod's throughput on 2 cores).

mpirun's own environment is the launcher's, plus the job's environment and secrets, plus the
above; ranks on mpirun's host inherit all of it, ranks on other hosts get what `-x` names.

## Output, failure, cancel

Every rank's output is kept in `rank-N.log` in the job directory; the console (and `mpirun.log`)
shows rank 0's output plus the error lines (and whole tracebacks) of the other ranks, prefixed
`[rank N]`.

When a rank ends with a non-zero status or a signal, mpirun stops the others (ddlkit kills the
job's whole session if that takes longer than `compute.abort_timeout_s`). The job's status names
the rank that failed *first* (its node, and host for `mpi`, its exit status or signal, and the
last lines of its log), then how the others ended. Nothing the job started survives it, nor the
launcher's exit when the job was not detached.

A cancel (Ctrl-C or SIGTERM to `ddlkit`, `ddlkit jobs cancel JOB` from any shell) asks every
rank's worker to stop, never mpirun with SIGTERM, which would kill the ranks a second later,
before they can checkpoint. `local_mpi` sends SIGTERM to each rank minder in the job's session;
`mpi` sends SIGUSR1 to mpirun, which forwards it to the ranks on every host, and each rank minder
passes it on to its worker as SIGTERM (a rank that starts after the cancel finds the cancel marker
and stops at once). The ranks agree on the step to stop at, rank 0 checkpoints, and all exit with
status 75; after `compute.grace_period_s` everything is killed. What happens next, restarts and
elastic world sizes included, is in [Failures, restarts and elastic jobs](../failures.md).

A detached job's id is its process minder's pid; `ddlkit jobs status|logs|attach|cancel JOB`
rebuilds the target from the job file and attaches. For `mpi` the rank layout is recorded at
submission (`.ddlkit/mpi-layout.json`), so attaching works in a shell outside the cluster job
whose scheduler named the hosts.

## How it works

Both targets are one implementation (`MpirunTarget`, `MpiJob`); they differ in where the ranks go
and how the node layout is learnt. `mpirun` runs under ddlkit's process minder
(`ddlkit.compute.process.ProcessJob`) in the job directory, its output in `mpirun.log`; every
rank runs `python -m ddlkit_mpi.rank --job-dir . ...` (`ddlkit_mpi.rank`) around the worker
command, which writes `rank-N.log` and an exit record per rank, from which the handle names the
rank that failed first; `attach(id)` follows, judges and cancels the job from another process.

The plugin's tests (`cd plugins/ddlkit-mpi && python -m pytest`; `-m "not slow"` skips the ones
that start mpirun, which are skipped where `mpirun` is missing) run the compute-target contract
for both targets, hostfile, host-list and scheduler parsing, the command line, `ddlkit plan`, the
errors through the CLI, the simulated node layout, logs, a killed rank and cancel, and
`compute=mpi` on two hosts: a hostfile that names this machine twice (`localhost`, and
`127.0.0.2`, which OpenMPI takes for another host) with an ssh stand-in
(`--mca plm_rsh_agent`) that runs OpenMPI's daemon here in a session of its own and a bare
environment, as a login on another host would. On it a 4-rank job trains (the test kit's
framework and PyTorch ResNet-18, `dist=native`), the ranks on the "other host" see only what
mpirun passed on, and a cancel reaches them through mpirun.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import ddlkit
from ddlkit.atomic import write_json, write_text
from ddlkit.compute.gang import ElasticGangConfig
from ddlkit.compute.layout import CONTROL_ADDR_ENV, control_port
from ddlkit.compute.outcome import Observation, judge
from ddlkit.compute.ports import free_ports
from ddlkit.compute.process import ProcessJob, kill_session, log_tail, processes
from ddlkit.compute.rank_exits import read_records
from ddlkit.interfaces import JobHandle, JobSpec, JobState, JobStatus
from ddlkit.jobdir import CANCEL_FILE, NODE_DOWN, RANKS_DIR, STATE_DIR
from ddlkit.options import MASTER_PORT, NON_NEGATIVE, POSITIVE_INTEGER, checked

from .hosts import Host, discover

#: mpirun's output (rank 0's plus the other ranks' error lines), in the job directory
MPIRUN_LOG = "mpirun.log"
RANK_MODULE = "ddlkit_mpi.rank"
#: the job's rank layout, written at submission for handles built later (``ddlkit jobs``)
LAYOUT_FILE = f"{STATE_DIR}/mpi-layout.json"
#: what every rank gets from mpirun's environment on every host (``-x NAME``), besides the job's own
RANK_ENV = ("MASTER_ADDR", "MASTER_PORT", CONTROL_ADDR_ENV, "PYTHONUNBUFFERED", "OMP_NUM_THREADS")


@dataclass
class LocalMpiConfig(ElasticGangConfig):
    # simulated nodes; the job has nodes x procs_per_node ranks, all on this machine
    nodes: int = checked(1, POSITIVE_INTEGER)
    # elastic: after losing nodes, a restart goes on with those left if at least this many (null: nodes,
    # not elastic). A simulated node is lost when its ranks are killed and it is marked down (a file
    # `down` in its scratch directory, nodes/node-K/down); it returns when the file is gone
    min_nodes: int | None = checked(None, POSITIVE_INTEGER)
    procs_per_node: int = checked(2, POSITIVE_INTEGER)
    # seconds a cancelled job gets to checkpoint at its next step before it is killed
    grace_period_s: float = 30.0
    # base directory of the nodes' local scratch ("local SSD") directories, node-K below it;
    # null: nodes/ in the job directory; relative: to the job directory
    scratch: str | None = None
    # after a rank has failed, seconds mpirun gets to stop the other ranks before ddlkit kills them
    abort_timeout_s: float = 5.0
    # the mpirun to run, and extra arguments for it (e.g. ["--mca", "btl", "self,tcp"])
    mpirun: str = "mpirun"
    mpirun_args: list[str] = field(default_factory=list)


@dataclass
class MpiConfig:
    # hosts as name or name:slots, e.g. [node1:4,node2:4]; or:
    hosts: list[str] = field(default_factory=list)
    # an OpenMPI hostfile (`host slots=N` per line); with neither, the scheduler's allocation
    # ($AZ_BATCHAI_MPI_HOST_FILE, $AZ_BATCH_HOST_LIST, $PBS_NODEFILE, $SLURM_JOB_NODELIST)
    hostfile: str | None = None
    # use only the first N hosts; null: all of them
    nodes: int | None = checked(None, POSITIVE_INTEGER)
    # elastic: after losing hosts, a restart goes on with the job's hosts that its host source still lists
    # (a hostfile a health check rewrites, the scheduler's allocation) if at least this many (null: all,
    # not elastic)
    min_nodes: int | None = checked(None, POSITIVE_INTEGER)
    # ranks per host (GPUs per node); null: each host's slots (1 where its source gives none)
    procs_per_node: int | None = checked(None, POSITIVE_INTEGER)
    # the ranks' interpreter on the hosts; null: this one (sys.executable)
    python: str | None = None
    # base of each node's scratch directory (its local disk), node-K below it; $VARS and ~ are
    # expanded on the node; null: nodes/ in the job directory; relative: to the job directory
    scratch: str | None = None
    # rank 0's rendezvous port on the first host (MASTER_PORT); ddlkit's control plane uses the next one
    master_port: int = checked(29500, MASTER_PORT)
    # seconds a cancelled job gets to checkpoint at its next step before it is killed
    grace_period_s: float = checked(30.0, NON_NEGATIVE)
    # after a rank has failed, seconds mpirun gets to stop the other ranks before ddlkit kills them
    abort_timeout_s: float = checked(5.0, NON_NEGATIVE)
    # the mpirun to run, and extra arguments for it (e.g. [--mca, btl_tcp_if_include, eth0])
    mpirun: str = "mpirun"
    mpirun_args: list[str] = field(default_factory=list)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


# ---------------------------------------------------------------------------- the job
#: OpenMPI's account of a rank it saw end by a signal
_MPIRUN_NOTICED = re.compile(r"mpirun noticed that process rank (\d+) .* exited on signal (\d+)")


class MpiJob(ProcessJob):
    """``mpirun`` as a :class:`~ddlkit.JobHandle`. ``id`` is its minder's pid; :meth:`logs`
    streams ``mpirun.log`` (rank 0's output plus every rank's error lines)."""

    #: ranks the job has (a job is a success only when all of them reported success)
    world_size: int = 1
    abort_timeout_s: float = 5.0
    #: how cancel() reaches the ranks: "session" (SIGTERM to each rank minder in the job's
    #: session, all on this machine) or "mpirun" (SIGUSR1 to mpirun, forwarded to every host)
    stop_via: str = "session"
    #: host names by node index, for messages (empty: simulated nodes)
    node_names: Sequence[str] = ()

    @classmethod
    def launch(
        cls,
        command: Sequence[str],
        *,
        job_dir: Path,
        env: Mapping[str, str],
        grace_period_s: float,
        world_size: int,
        abort_timeout_s: float,
        stop_via: str,
        node_names: Sequence[str] = (),
    ) -> MpiJob:
        """Start ``command`` (an mpirun command line) in ``job_dir``, and its abort watchdog here."""
        # a resumed job runs in the same directory: the previous run's exit records are not ours
        shutil.rmtree(Path(job_dir) / RANKS_DIR, ignore_errors=True)
        # should the launcher die before detaching the job, the minder asks the ranks to stop as a
        # cancel does: mpirun passes SIGUSR1 on to every rank (SIGTERM would kill them at once)
        job = cls.start(
            command,
            job_dir=job_dir,
            log_name=MPIRUN_LOG,
            env=env,
            grace_period_s=grace_period_s,
            stop_signal=signal.SIGUSR1,
        )
        assert isinstance(job, MpiJob)
        job.configure(world_size=world_size, abort_timeout_s=abort_timeout_s, stop_via=stop_via, node_names=node_names)
        threading.Thread(target=job._watch, name=f"ddlkit-mpi-watch-{job.id}", daemon=True).start()
        return job

    @classmethod
    def find(
        cls,
        job_id: str,
        *,
        job_dir: Path,
        grace_period_s: float,
        world_size: int,
        abort_timeout_s: float,
        stop_via: str,
        node_names: Sequence[str] = (),
    ) -> MpiJob:
        """The job ``job_id`` (started by :meth:`launch`, maybe in another process)."""
        job = cls.attach(job_id, job_dir=job_dir, log_name=MPIRUN_LOG, grace_period_s=grace_period_s)
        assert isinstance(job, MpiJob)
        job.configure(world_size=world_size, abort_timeout_s=abort_timeout_s, stop_via=stop_via, node_names=node_names)
        return job

    def configure(
        self, *, world_size: int, abort_timeout_s: float, stop_via: str, node_names: Sequence[str] = ()
    ) -> None:
        self.world_size, self.abort_timeout_s, self.stop_via = world_size, abort_timeout_s, stop_via
        self.node_names = tuple(node_names)

    # ------------------------------------------------------------ the job's processes
    def _rank_minders(self) -> list[int]:
        """The ``ddlkit_mpi.rank`` processes of this job on this machine."""
        return [p for p in self.session() if _cmdline(p)[1:3] == ["-m", RANK_MODULE]]

    def _mpirun(self) -> int | None:
        """mpirun's pid: the minder's child that is not its guard (a fork of the minder)."""
        minder = _cmdline(self.pid)
        return next(
            (pid for pid, ppid, sid in processes() if ppid == self.pid and sid == self.pid and _cmdline(pid) != minder),
            None,
        )

    def _kill_leftovers(self) -> None:
        for pid in self.session():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------ rank records
    def _watch(self) -> None:
        """The backstop of mpirun's own abort, in the process that started the job: once a rank
        has failed, the others get ``abort_timeout_s`` to end before the session is killed."""
        assert self.proc is not None
        failed_at: float | None = None
        while self.proc.poll() is None:
            if failed_at is None:
                if any(r["code"] != 0 for r in read_records(self.job_dir)):
                    failed_at = time.monotonic()
            elif time.monotonic() - failed_at > self.abort_timeout_s:
                # all but the minder, which records how mpirun ended
                kill_session(self.pid, signal.SIGKILL, spare=self.pid)
                return
            time.sleep(0.1)

    def final_status(self, code: int) -> JobStatus:
        # mpirun has ended: whatever a rank left behind goes with it
        self._kill_leftovers()
        # what mpirun saw of ranks that may have left no record (killed with their rank minder)
        noticed = {int(m[1]): -int(m[2]) for m in _MPIRUN_NOTICED.finditer("\n".join(log_tail(self.log_path, 40)))}
        seen = Observation(
            JobState.SUCCEEDED if code == 0 else JobState.FAILED,
            code,
            rank_signals=noticed,
            ranks_always_report=True,
        )
        return judge(
            seen, self.job_dir, job="mpirun", world_size=self.world_size, log=self.log_path, node_names=self.node_names
        )

    # ------------------------------------------------------------ cancel
    def cancel(self) -> None:
        if self.status().state.done or self.cancel_requested:
            return
        write_text(self.job_dir / CANCEL_FILE, f"{time.time()}\n")
        threading.Thread(target=self._terminate, name=f"ddlkit-mpi-cancel-{self.id}", daemon=True).start()

    def _terminate(self) -> None:
        """Ask every rank to stop -- again for ranks that are still starting -- then, once the
        grace period is over, kill the session."""
        deadline = time.monotonic() + self.grace
        signalled: set[int] = set()
        while not self.status().state.done and time.monotonic() < deadline:
            if self.stop_via == "mpirun":
                # mpirun forwards SIGUSR1 to the ranks it has started, on every host; each rank's
                # minder passes it on to its worker as SIGTERM. Once: a rank that starts later
                # finds the cancel marker (written before this) and stops by itself
                if not signalled and (mpirun := self._mpirun()) is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(mpirun, signal.SIGUSR1)
                    signalled.add(mpirun)
            else:
                for pid in self._rank_minders():
                    if pid not in signalled:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
                        signalled.add(pid)
            time.sleep(0.1)
        self._kill()


# ---------------------------------------------------------------------------- targets
class MpirunTarget(ddlkit.ComputeTarget):
    """What ``local_mpi`` and ``mpi`` share: the mpirun command, the ranks' environment, the job."""

    # mpirun runs on this machine and answers at once
    status_interval_s = 0.05
    # the ranks run in the launcher's job directory (on a shared file system for other hosts)
    shares_job_dir = True
    #: every host runs the launcher's interpreter (the same path on a shared or identical install)
    ranks_share_environment = True
    #: how cancel() reaches the ranks, see :attr:`MpiJob.stop_via`
    stop_via: ClassVar[str] = "session"
    #: environment set for the ranks besides :data:`RANK_ENV` (passed on with ``-x`` too)
    extra_env_names: ClassVar[tuple[str, ...]] = ()
    #: the registered name, for messages
    name: ClassVar[str]

    @property
    def world_size(self) -> int:
        return sum(self.node_sizes())

    # ------------------------------------------------------------ what the subclasses say
    def node_sizes(self) -> list[int]:
        """Ranks per node, in the order mpirun places them."""
        raise NotImplementedError

    def node_names(self) -> list[str]:
        return []

    def ranks_per_machine(self) -> int:
        """How many ranks share a machine's cores (the most on any host)."""
        return max(self.node_sizes())

    def placement_args(self) -> list[str]:
        """mpirun's arguments that say where the ranks go."""
        raise NotImplementedError

    def layout_args(self) -> list[str]:
        """The rank minder's arguments that say how a rank learns its node and local rank."""
        raise NotImplementedError

    def rendezvous(self) -> tuple[str, int, int]:
        """(rank 0's address, MASTER_PORT, the control plane's port)."""
        raise NotImplementedError

    def python(self) -> str:
        return sys.executable

    def check_runnable(self) -> None:
        """local_mpi checks when it is built; mpi when it submits, so that ``ddlkit plan`` prints
        its command on a machine without OpenMPI."""
        if shutil.which(self.cfg.mpirun) is None:
            raise ddlkit.ConfigError(
                f"compute={self.name} needs OpenMPI's `{self.cfg.mpirun}`, which is not on PATH: "
                "apt-get install openmpi-bin (or set compute.mpirun to its path)."
            )

    # ------------------------------------------------------------ the command and its environment
    def forwarded_env(self, spec: JobSpec) -> list[str]:
        """The names passed to the ranks with ``-x NAME``: the value stays in mpirun's environment,
        so a secret never shows on a command line (nor in ``ddlkit plan``)."""
        return list(dict.fromkeys([*RANK_ENV, *self.extra_env_names, *spec.env, *spec.secret_env]))

    def command(self, spec: JobSpec, python: str | None = None) -> list[str]:
        """The mpirun command line, run with the job directory as working directory."""
        c = self.cfg
        python = python or self.python()
        mpirun = c.mpirun
        if os.sep in mpirun and not os.path.isabs(mpirun):
            mpirun = os.path.abspath(mpirun)  # mpirun starts in the job directory
        return [
            mpirun,
            "-np",
            str(self.world_size),
            *self.placement_args(),
            # ranks fill one node after the other; none is pinned, so the OS spreads them
            "--bind-to",
            "none",
            "--map-by",
            "slot",
            *(arg for name in self.forwarded_env(spec) for arg in ("-x", name)),
            *c.mpirun_args,
            python,
            "-m",
            RANK_MODULE,
            "--job-dir",
            ".",
            *self.layout_args(),
            "--scratch",
            c.scratch or "nodes",
            "--cancel-file",
            CANCEL_FILE,
            "--",
            *spec.command(python),
        ]

    def environment(self, spec: JobSpec) -> dict[str, str]:
        """mpirun's environment: this one, the job's (``spec.env``, ``spec.secret_env``), the rendezvous."""
        addr, master_port, control = self.rendezvous()
        env = {
            **os.environ,
            **spec.env,
            **spec.secret_env,
            "PYTHONUNBUFFERED": "1",
            # torch.distributed's rendezvous, and ddlkit's control plane
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(master_port),
            CONTROL_ADDR_ENV: f"{addr}:{control}",
        }
        # like torchrun: ranks sharing a machine share its cores instead of each taking them all
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.ranks_per_machine())))
        if os.geteuid() == 0:
            # containers run as root; OpenMPI refuses that unless told both of these
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env

    def plan(self, spec: JobSpec) -> str:
        return shlex.join(self.command(spec))

    # ------------------------------------------------------------ ComputeTarget
    def submit(self, spec: JobSpec) -> JobHandle:
        self.check_runnable()
        command, env = self.command(spec), self.environment(spec)
        # what attach() needs, should it be built where the hosts cannot be found again (another
        # shell, outside the cluster job): no secret, only the layout
        write_json(
            spec.job_dir / LAYOUT_FILE,
            {"world_size": self.world_size, "node_sizes": self.node_sizes(), "node_names": self.node_names()},
        )
        return MpiJob.launch(
            command,
            job_dir=spec.job_dir,
            env=env,
            grace_period_s=self.cfg.grace_period_s,
            world_size=self.world_size,
            abort_timeout_s=self.cfg.abort_timeout_s,
            stop_via=self.stop_via,
            node_names=self.node_names(),
        )

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        try:
            layout = json.loads((Path(job_dir) / LAYOUT_FILE).read_text(encoding="utf-8"))
            world_size, node_names = int(layout["world_size"]), list(layout["node_names"])
        except (OSError, ValueError, KeyError, TypeError):
            world_size, node_names = self.world_size, self.node_names()
        return MpiJob.find(
            job_id,
            job_dir=job_dir,
            grace_period_s=self.cfg.grace_period_s,
            world_size=world_size,
            abort_timeout_s=self.cfg.abort_timeout_s,
            stop_via=self.stop_via,
            node_names=node_names,
        )


class LocalMpiTarget(MpirunTarget):
    """``compute=local_mpi``: ``nodes`` x ``procs_per_node`` ranks on this machine."""

    cfg: LocalMpiConfig
    name = "local_mpi"
    extra_env_names = ("GLOO_SOCKET_IFNAME",)
    # a simulated node marked down comes back only when its mark is removed: a restart that has too
    # few does not wait for them unless restart.capacity_wait_s says so
    default_capacity_wait_s = 0.0

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.check_runnable()
        #: which simulated nodes the job's nodes are (their scratch directories): all at first, those
        #: not marked down after a restart on fewer (with_nodes)
        self.node_ids: list[int] = list(range(cfg.nodes))

    def node_sizes(self) -> list[int]:
        return [self.cfg.procs_per_node] * self.cfg.nodes

    def _up(self, spec: JobSpec) -> list[int]:
        """The simulated nodes not marked down (no ``down`` file in their scratch directory)."""
        scratch = spec.job_dir / (self.cfg.scratch or "nodes")
        return [k for k in range(self.cfg.nodes) if not (scratch / f"node-{k}" / NODE_DOWN).exists()]

    def nodes_up(self, spec: JobSpec) -> int | None:
        return len(self._up(spec))

    def with_nodes(self, nodes: int, spec: JobSpec) -> LocalMpiTarget:
        target = super().with_nodes(nodes, spec)
        assert isinstance(target, LocalMpiTarget)
        up = self._up(spec)
        target.node_ids = (up + [k for k in range(self.cfg.nodes) if k not in up])[:nodes]
        return target

    def ranks_per_machine(self) -> int:
        return self.world_size  # every simulated node is this machine

    def placement_args(self) -> list[str]:
        # a simulation on one machine: ranks may outnumber cores (and OpenMPI counts physical cores)
        return ["--oversubscribe"]

    def layout_args(self) -> list[str]:
        ids = ["--node-ids", ",".join(map(str, self.node_ids))] if self.node_ids != list(range(self.cfg.nodes)) else []
        return ["--procs-per-node", str(self.cfg.procs_per_node), *ids]

    def rendezvous(self) -> tuple[str, int, int]:
        master_port, control = free_ports(2)  # free loopback ports, chosen per job where no connection takes them
        return "127.0.0.1", master_port, control

    def environment(self, spec: JobSpec) -> dict[str, str]:
        env = super().environment(spec)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # a rank waiting in an MPI collective (Horovod's all-reduce) busy-polls; on a machine whose
        # cores all train, that steals the core another rank computes on. Yielding doubled Horovod's
        # 2-rank throughput on 2 cores (OpenMPI yields by itself only when ranks outnumber slots)
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        # PMIx (mpirun's link to its ranks) authenticates them with munge where munge is installed,
        # and when its daemon is not running it retries for 2 s before it falls back: every start
        # and restart of a local job paid that (mpirun of `true`: 2.29 s, 0.03 s with native). The
        # ranks are this machine's processes: the native check (the socket peer's uid) is the one
        # that applies; munge authenticates across hosts (compute=mpi keeps the cluster's setting)
        env.setdefault("PMIX_MCA_psec", "native")
        return env


# ---------------------------------------------------------------------------- compute=mpi
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "127.0.0.1", "::1"}


def _local_addresses() -> set[str]:
    """This machine's interface addresses (IPv4 by ioctl, IPv6 from /proc), as OpenMPI compares them."""
    found = {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                req = struct.pack("256s", name.encode()[:15])
                addr = fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]  # SIOCGIFADDR
                found.add(socket.inet_ntoa(addr))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = bytes.fromhex(line.split()[0])
            found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def is_this_host(name: str) -> bool:
    """Whether OpenMPI takes host ``name`` for the machine mpirun runs on: a loopback name, this
    machine's host name (short or not), or one of its interface addresses. No name lookup."""
    if name in _LOOPBACK_NAMES:
        return True
    if _is_ip(name):
        return name in _local_addresses()
    # OpenMPI compares host names without their domain (orte_keep_fqdn_hostnames=false)
    return name.split(".")[0] == socket.gethostname().split(".")[0]


def _is_ip(name: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            socket.inet_pton(family, name)
            return True
    return False


class MpiTarget(MpirunTarget):
    """``compute=mpi``: one job across real hosts."""

    cfg: MpiConfig
    name = "mpi"
    # the ranks may run on other machines: mpirun forwards SIGUSR1 to all of them
    stop_via = "mpirun"

    def __init__(self, cfg: Any, env: Mapping[str, str] | None = None) -> None:
        super().__init__(cfg)
        # the hosts depend on where the target is built: inside the cluster job (the scheduler's
        # variables, the hostfile) they must be found, and a problem is an error as soon as the
        # job needs them (the launcher asks world_size first); `ddlkit jobs` in another shell
        # attaches from the layout recorded at submission instead
        self._error: ddlkit.ConfigError | None = None
        try:
            self._hosts, self._sizes = self._resolve(env)
        except ddlkit.ConfigError as e:
            self._error = e

    def _resolve(self, env: Mapping[str, str] | None) -> tuple[list[Host], list[int]]:
        c = self.cfg
        hosts, self.source = discover(c.hosts, c.hostfile, env)
        if c.nodes is not None:
            if c.nodes > len(hosts):
                raise ddlkit.ConfigError(
                    f"compute.nodes={c.nodes} asks for more hosts than {self.source} names "
                    f"({len(hosts)}: {', '.join(h.name for h in hosts)})."
                )
            hosts = hosts[: c.nodes]
        wanted = c.procs_per_node
        short = [h for h in hosts if wanted is not None and h.slots is not None and h.slots < wanted]
        if short:
            total_slots = sum(h.slots or c.procs_per_node for h in hosts)
            raise ddlkit.ConfigError(
                f"compute=mpi asks for {c.procs_per_node * len(hosts)} ranks (compute.procs_per_node="
                f"{c.procs_per_node} on {len(hosts)} hosts) but the hosts have {total_slots} slots: "
                + ", ".join(f"{h.name} has {h.slots}" for h in short)
                + f" (from {self.source})."
            )
        # mpirun places the first ranks on its own host when that host is listed (OpenMPI's rule,
        # whatever the order given): list it first, so node ids and rank 0's address are right
        local = [h for h in hosts if is_this_host(h.name)]
        hosts = local[:1] + [h for h in hosts if h not in local[:1]]
        return hosts, [c.procs_per_node or h.slots or 1 for h in hosts]

    @property
    def hosts(self) -> list[Host]:
        if self._error is not None:
            raise self._error
        return self._hosts

    @property
    def sizes(self) -> list[int]:
        if self._error is not None:
            raise self._error
        return self._sizes

    def node_sizes(self) -> list[int]:
        return list(self.sizes)

    def node_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    # ------------------------------------------------------------ elastic
    @property
    def nodes(self) -> int:
        return len(self.hosts)

    def _listed_now(self) -> list[Host]:
        """The job's hosts that its host source lists now, in the job's order: a host lost for good
        is one a health check (or the scheduler, or the user) took out of the hostfile or allocation."""
        listed, _ = discover(self.cfg.hosts, self.cfg.hostfile, None)
        names = {h.name for h in listed}
        return [h for h in self.hosts if h.name in names]

    def nodes_up(self, spec: JobSpec) -> int | None:
        try:
            return len(self._listed_now())
        except ddlkit.ConfigError:
            return None  # the host source cannot be read now: the job restarts on all its hosts

    def with_nodes(self, nodes: int, spec: JobSpec) -> MpiTarget:
        target = copy.copy(self)
        keep = self._listed_now()[:nodes]
        target._hosts = keep
        target._sizes = [size for host, size in zip(self.hosts, self.sizes, strict=True) if host in keep]
        return target

    def placement_args(self) -> list[str]:
        # every host with the ranks it runs: exactly what the hostfile allows, no oversubscription
        return ["-H", ",".join(f"{h.name}:{n}" for h, n in zip(self.hosts, self.sizes, strict=True))]

    def layout_args(self) -> list[str]:
        return ["--node-sizes", ",".join(map(str, self.sizes))]

    def python(self) -> str:
        return self.cfg.python or sys.executable

    def rendezvous(self) -> tuple[str, int, int]:
        first = self.hosts[0].name
        if first in _LOOPBACK_NAMES and not all(is_this_host(h.name) for h in self.hosts):
            first = socket.gethostname()  # other machines cannot reach rank 0 at "localhost"
        return first, self.cfg.master_port, control_port(self.cfg.master_port)
