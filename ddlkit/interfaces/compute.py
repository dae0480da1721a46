"""Compute targets: where the ranks of a job run.

The contract is asynchronous so that a local child process, an ``mpirun`` on this machine
and a job on a remote cluster fit it alike (and a sweep can keep many jobs in flight)::

    handle = target.submit(spec)        # returns at once
    for chunk in handle.logs(): ...     # rank 0's output, streamed until the job ends
    status = handle.wait()              # or handle.status() to poll, handle.cancel() to stop
    handle.collect()                    # the job's files, back in the launcher's job directory
    later = target.attach(handle.id, job_dir=spec.job_dir)   # the same job, from another process

**A job is its directory.** The launcher writes the job directory (``job.json``, the config
copies) and the target makes it available where the ranks run -- the same directory on a
shared disk, or a copy. Every rank runs ``<python> *spec.args`` with *that* directory as its
working directory; nothing in the directory or in ``spec.args`` names the launcher's paths or
interpreter, so the job runs unchanged wherever the directory is copied or mounted, by whatever
Python is there. What the ranks write (checkpoints, metrics, ``rank-N.log``, ``result.json``)
lands in that directory; :meth:`JobHandle.collect` brings it back to ``spec.job_dir`` when the
target's directory is not the launcher's.

What the core does: composes and validates the config, builds the target once per job, writes
the job directory, puts the environment the ranks need in ``spec.env`` and secrets in
``spec.secret_env``, records the job (``ddlkit jobs``), streams, collects, reads ``result.json``.
What a target does: the rest -- and keeps secrets in its secret channel, never in a file.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omegaconf import DictConfig

# re-exported: the job file and the rank command are part of this contract (ddlkit.JOB_FILE)
from ..jobdir import JOB_FILE, WORKER_ARGS


class JobState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    #: the job's exit code once done (the first failing rank's, for multi-rank jobs)
    exit_code: int | None = None
    #: once done, a human explanation of a failure: which rank, what status, the last log lines;
    #: before, what the target says of the job in one line -- a scheduler's state and its reason for
    #: keeping the job queued ("Slurm: PENDING, reason Resources"), where it runs. The launcher shows
    #: it while the job has no output yet, once and on each change. A job that can never start (it asks
    #: for more than the cluster has) is no pending job: the target ends it, FAILED, the fix in its message
    message: str = ""
    #: once done, the restarts the target made in place during this submission under
    #: :attr:`JobSpec.restart` (the restart policy's entries: ``ddlkit.compute.restarts``), which the
    #: launcher counts against the job's ``restart.max_restarts`` and adds to its record
    restarts: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class RestartBudget:
    """The restart policy of a job, for a target that can restart the job's ranks in place -- where
    they run, without a new submission: a Ray job's driver places its gang again on the nodes the
    cluster has. Such a target applies the core's policy (``ddlkit.compute.restarts.RestartPolicy.
    from_budget``: the same classification, counting, backoff and console line as the launcher's)
    and reports what it did in :attr:`JobStatus.restarts`; what it cannot do in place (the gang does
    not fit at its size) it leaves to the launcher by ending the job. Other targets ignore it."""

    #: ``restart.max_restarts``: the job's whole allowance, the launcher's restarts included
    max_restarts: int
    #: ``restart.backoff_s``: the wait before the first restart, doubled for each one after it
    backoff_s: float
    #: the restarts the job has had so far, and the optimizer steps they lost
    done: int = 0
    steps_lost: int = 0


@dataclass(frozen=True)
class JobSpec:
    """Everything a compute target needs to run one job."""

    #: unique (two job directories never share a name) and filesystem-safe,
    #: e.g. "2026-11-22_10-04-01-3fa2c1d9"; stable across re-runs of the same job directory
    name: str
    #: the launcher's job directory: what the target makes available to the ranks, and where
    #: :meth:`JobHandle.collect` brings their files back
    job_dir: Path
    #: what every rank runs after the interpreter, with the job directory as working directory
    args: tuple[str, ...] = WORKER_ARGS
    #: environment the ranks need besides the target's own (plugins to load, storage account, ...)
    env: Mapping[str, str] = field(default_factory=dict)
    #: environment that is secret (storage keys, SAS tokens, API keys, the config's secrets):
    #: the target passes it through its secret channel, never writes it to a file or a log
    secret_env: Mapping[str, str] = field(default_factory=dict)
    #: the digest of the code snapshot the job ships (``code/``, listed in ``code.json``; see
    #: :mod:`ddlkit.compute.snapshot`), None when it ships none. The same tree has the same digest:
    #: a target that uploads code may keep one copy per digest and upload an unchanged tree once
    code_digest: str | None = None
    #: the restart policy a target may apply in place (:class:`RestartBudget`); None: restarts are
    #: the launcher's alone (the job runs on fewer nodes than planned, and grows back by a new submission)
    restart: RestartBudget | None = None

    @property
    def job_file(self) -> Path:
        """The launcher's copy of the job file."""
        return self.job_dir / JOB_FILE

    def command(self, python: str) -> list[str]:
        """The rank's command line for the interpreter ``python`` (``sys.executable`` on this
        machine; ``python`` or an image's interpreter elsewhere)."""
        return [python, *self.args]


class JobHandle(ABC):
    """A submitted job."""

    #: the target's id for the job: :meth:`ComputeTarget.attach` rebuilds a handle from it
    id: str

    @abstractmethod
    def status(self) -> JobStatus: ...

    @abstractmethod
    def logs(self, follow: bool = True) -> Iterator[str]:
        """Rank 0's output in chunks of text, from its start; with ``follow`` it ends only when
        the job ends, without ``follow`` it ends with what there is now."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask the job to stop (a ddlkit job checkpoints first); idempotent."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job is done (or ``timeout`` seconds pass) and return its status."""

    def poll_until_done(self, timeout: float | None, interval_s: float) -> JobStatus:
        """A :meth:`wait` for handles that can only ask: :meth:`status` every ``interval_s``
        seconds until the job is done or ``timeout`` seconds have passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (status := self.status()).state.done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return status
            time.sleep(interval_s if left is None else min(interval_s, left))
        return status

    def collect(self) -> None:
        """Bring what the ranks wrote (``result.json``, ``rank-N.log``, metrics, the model, the
        latest checkpoint) into the launcher's job directory. Called by the core after the job
        ended, whatever its state, before it reads ``result.json``. Targets that run the job in
        the launcher's own directory (a shared disk) have nothing to do."""

    def peek(self) -> None:
        """Bring the files a running job keeps current (rank 0's ``telemetry.json``: the ranks' step
        telemetry, which ``ddlkit jobs status`` shows) into the launcher's job directory. Called while
        the job runs; nothing to do where the ranks write into that directory (a shared disk)."""

    def detach(self) -> None:
        """Let the job outlive this process: the launcher is about to exit without waiting, and
        :meth:`ComputeTarget.attach` finds the job again later. Jobs on a remote scheduler are
        detached anyway; a target that runs processes of its own undoes its exit guard."""


class ComputeTarget(ABC):
    """Runs jobs. ``world_size`` is how many ranks a job on this target has.

    The core builds one target per job, from ``cfg`` (the ``compute`` config node)."""

    #: how often (seconds) a watcher such as the sweep scheduler should ask :meth:`JobHandle.status`:
    #: a scheduler's API has rate limits and minute-long queues; a local process answers at once
    status_interval_s: float = 5.0
    #: whether ranks run in the launcher's own job directory (a local disk or a shared file
    #: system): then the launcher checks ``trainer.resume`` before submitting, and collect() is a no-op
    shares_job_dir: ClassVar[bool] = False
    #: how many times the launcher restarts a job of this target that the infrastructure ended
    #: (``restart.max_restarts``, when the user sets none): a cluster loses nodes and preempts
    #: them; a process on the user's own machine that was killed was most likely killed on purpose
    default_max_restarts: ClassVar[int] = 3
    #: how long a restart waits for the nodes it needs when :meth:`nodes_up` says fewer are up
    #: (``restart.capacity_wait_s``, when the user sets none): a cluster's lost node is replaced, or
    #: another job's nodes come free, within minutes
    default_capacity_wait_s: ClassVar[float] = 600.0

    @property
    def ranks_share_environment(self) -> bool:
        """Whether the ranks run with the launcher's own Python environment (this interpreter and
        its installed packages): then the launcher checks what the framework needs there
        (:meth:`ddlkit.Framework.check_environment`) before submitting. A target whose ranks run in
        an image or another interpreter says False: the ranks check it where they run, at once."""
        return False

    def __init__(self, cfg: Any) -> None:
        from ..options import check

        # the rules on its schema's fields (ddlkit.options): a target is built outside a
        # validated run too (ddlkit jobs, ddlkit compute down)
        check(cfg, "compute")
        self.cfg = cfg

    def configure(self, config: DictConfig) -> None:
        """Validate this target's options against the whole composed ``config`` in the launcher,
        before anything runs; raise ConfigError. Called for the selected target only (the
        options that need no other part of the config are best checked by the constructor)."""

    @property
    def world_size(self) -> int:
        """The ranks of a job: ``nodes x procs_per_node`` for a target whose schema is a
        :class:`ddlkit.compute.gang.GangConfig`, 1 for a target that says nothing else."""
        from ..compute.gang import is_gang, world_size

        return world_size(self.cfg) if is_gang(self.cfg) else 1

    # ---------------------------------------------------------------- elastic world size
    # A job of ``nodes`` nodes whose target sets ``compute.min_nodes`` lower is elastic: when the
    # launcher restarts it (ddlkit.launch.follow), it asks :meth:`nodes_up` how many of its nodes
    # are usable now and resubmits it on that many (never fewer than ``min_nodes``, never more than
    # ``nodes``) through :meth:`with_nodes`; the ranks adapt the batch to the world size they find
    # (``trainer.on_resize``, ddlkit.rank.resize). A target whose config has no ``min_nodes`` is not
    # elastic: its jobs restart on all their nodes. Any restart with fewer nodes up than it needs waits
    # for them, asking :meth:`nodes_up` again, up to ``restart.capacity_wait_s`` (ddlkit.launch.elastic).

    @property
    def nodes(self) -> int:
        """The nodes a job of this target asks for (``compute.nodes``; 1 for a target without nodes)."""
        from ..compute.gang import is_gang

        if is_gang(self.cfg):
            return int(self.cfg.nodes)
        # a config that is no GangConfig: read by name for one more minor version (a target's own
        # schema written before ddlkit.compute.gang; compute=mpi says its nodes itself, from its hosts)
        return int(getattr(self.cfg, "nodes", None) or 1)

    @property
    def min_nodes(self) -> int:
        """The fewest nodes a job may go on with after it lost some (``compute.min_nodes``; null or
        absent: :attr:`nodes`, the job is not elastic)."""
        from ..compute.gang import is_gang
        from ..errors import ConfigError

        if is_gang(self.cfg):
            least = self.cfg.min_nodes if is_gang(self.cfg, elastic=True) else None
        else:  # a config that is no GangConfig: compute=mpi's, or a target's schema written before it
            least = getattr(self.cfg, "min_nodes", None)
        if least is None:
            return self.nodes
        if not 1 <= int(least) <= self.nodes:
            raise ConfigError(
                f"compute.min_nodes={least} must be between 1 and compute.nodes={self.nodes} (the "
                "fewest nodes the job goes on with after losing some); null: not elastic."
            )
        return int(least)

    def nodes_up(self, spec: JobSpec) -> int | None:
        """How many of the :attr:`nodes` nodes the job ``spec`` would get now, asked just before
        an elastic job is restarted: a scheduler's count of its partition's usable nodes, the hosts
        of a host list that answer, a simulated cluster's nodes not marked down. None: this target
        cannot tell (the job is restarted on all its nodes, and the infrastructure replaces a lost one)."""
        return None

    def with_nodes(self, nodes: int, spec: JobSpec) -> ComputeTarget:
        """This target for the job ``spec`` on ``nodes`` nodes (``1 <= nodes <= self.nodes``, no more than
        :meth:`nodes_up` said): how a restart asks for fewer nodes, or all of them again. The default builds the
        target again from its config with ``compute.nodes`` replaced; a target whose nodes are not just a count
        says more."""
        import dataclasses

        from omegaconf import OmegaConf, open_dict

        if OmegaConf.is_config(self.cfg):
            cfg = self.cfg.copy()
            OmegaConf.set_readonly(cfg, False)
            with open_dict(cfg):
                cfg.nodes = nodes
        else:
            cfg = dataclasses.replace(self.cfg, nodes=nodes)
        return type(self)(cfg)

    @abstractmethod
    def submit(self, spec: JobSpec) -> JobHandle: ...

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        """A handle on the job ``job_id`` that an earlier :meth:`submit` started (maybe in another
        process); ``job_dir`` is the launcher's job directory of that job. It must work for a
        running job and for one that has ended."""
        from ..errors import ConfigError

        raise ConfigError(
            f"compute={getattr(self.cfg, 'name', type(self).__name__)} cannot attach to a job "
            "it did not start in this process."
        )

    def plan(self, spec: JobSpec) -> str:
        """What :meth:`submit` would do, for ``ddlkit plan``: the command line or the request it
        would send, with secrets redacted. Runs nothing, needs no credentials and no network."""
        return " ".join(spec.command("python"))

    def down(self, *, confirm: Callable[[Sequence[str]], bool]) -> list[str]:
        """``ddlkit compute down``: delete what this target created for earlier jobs and keeps
        between them (a cluster, a file server), and nothing it did not create. Call ``confirm``
        with one line per resource it would delete; delete only when it returns True. Returns the
        lines of what was deleted. Targets that keep nothing between jobs say so."""
        from ..errors import ConfigError

        raise ConfigError(
            f"compute={getattr(self.cfg, 'name', type(self).__name__)} keeps nothing between jobs: "
            "there is nothing to take down."
        )
