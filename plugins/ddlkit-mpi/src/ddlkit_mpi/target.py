"""``compute=local_mpi``: a job's ranks on this machine, started by OpenMPI's ``mpirun``, as if
on ``compute.nodes`` nodes of ``compute.procs_per_node`` ranks each.

The launcher side. ``mpirun`` runs in a session of its own, and every rank runs
``python -m ddlkit_mpi.rank`` (see :mod:`ddlkit_mpi.rank`) around the worker command, which
writes ``rank-N.log`` and an exit record per rank. From those this handle reports the rank that
failed first. The guarantees:

* a rank that dies (any non-zero status or signal) ends the job: mpirun stops the others, and if
  it has not within ``compute.abort_timeout_s`` the handle kills everything in the session;
* ``cancel()`` sends SIGTERM to each rank's worker (not to mpirun, which would kill the ranks
  after a second, before they can checkpoint), and kills the session after
  ``compute.grace_period_s``;
* when the job ends, or the launcher exits, nothing the job started survives.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ddlkit
from ddlkit.builtin.local_compute import ProcessHandle, describe_exit
from ddlkit.interfaces import JobHandle, JobSpec, JobState, JobStatus

from .rank import RECORDS_DIR

#: sessions (mpirun's pid) of jobs still running; killed when the launcher exits
_LIVE_SESSIONS: set[int] = set()


@atexit.register
def _kill_leftover_sessions() -> None:
    for sid in list(_LIVE_SESSIONS):
        kill_session(sid, signal.SIGKILL)


@dataclass
class LocalMpiConfig:
    # simulated nodes; the job has nodes x procs_per_node ranks, all on this machine
    nodes: int = 1
    # ranks per node (on a GPU cluster: GPUs per node)
    procs_per_node: int = 2
    # seconds a cancelled job gets to checkpoint at its next step before it is killed
    grace_period_s: float = 30.0
    # base directory of the nodes' local scratch ("local SSD") directories, node-K below it;
    # null: <job_dir>/nodes
    scratch: str | None = None
    # after a rank has failed, seconds mpirun gets to stop the other ranks before ddlkit kills them
    abort_timeout_s: float = 5.0
    # the mpirun to run, and extra arguments for it (e.g. ["--mca", "btl", "self,tcp"])
    mpirun: str = "mpirun"
    mpirun_args: list[str] = field(default_factory=list)


def _processes() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every process, from /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        yield int(entry.name), int(fields[1]), int(fields[3])


def kill_session(sid: int, sig: int) -> None:
    """Signal every process of session ``sid``: mpirun puts each rank in a process group of its
    own, so a process-group kill would miss them, but all stay in mpirun's session."""
    for pid, _, session in _processes():
        if session == sid:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all bound at once, so none is handed out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class MpiJobHandle(ProcessHandle):
    """``mpirun`` as a :class:`~ddlkit.JobHandle`. :meth:`logs` streams mpirun's output (rank 0
    plus every rank's error lines), also kept in ``mpirun.log``."""

    def __init__(self, proc: subprocess.Popen, spec: JobSpec, cfg: LocalMpiConfig, world_size: int) -> None:
        super().__init__(proc, spec.job_dir / "mpirun.log", cfg.grace_period_s, f"{spec.name}:{proc.pid}")
        _LIVE_SESSIONS.add(proc.pid)
        self.job_dir, self.cfg, self.world_size = spec.job_dir, cfg, world_size
        self.records_dir = spec.job_dir / RECORDS_DIR
        self._watchdog = threading.Thread(target=self._watch, name=f"ddlkit-mpi-watch-{self.id}", daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------ rank records
    def _records(self) -> list[dict[str, Any]]:
        records = []
        for path in sorted(self.records_dir.glob("rank-*.json")):
            try:
                records.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue  # being replaced right now; read again next time
        return records

    def _watch(self) -> None:
        """The backstop of mpirun's own abort: once a rank has failed, the others get
        ``abort_timeout_s`` to end before the whole session is killed."""
        failed_at: float | None = None
        while self.proc.poll() is None:
            if failed_at is None:
                if any(r["code"] != 0 for r in self._records()):
                    failed_at = time.monotonic()
            elif time.monotonic() - failed_at > self.cfg.abort_timeout_s:
                kill_session(self.proc.pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    # ------------------------------------------------------------ JobHandle
    def _final(self, code: int) -> JobStatus:
        # mpirun has ended: whatever a rank left behind goes with it
        kill_session(self.proc.pid, signal.SIGKILL)
        _LIVE_SESSIONS.discard(self.proc.pid)
        super()._final(code)  # for its side effect: local_compute's exit guard forgets the process
        records = self._records()
        failures = sorted((r for r in records if r["code"] != 0), key=lambda r: r["time"])
        if code == 0 and not failures and len(records) == self.world_size:
            return JobStatus(JobState.SUCCEEDED, 0)
        state = JobState.CANCELLED if self._cancelled else JobState.FAILED
        if not failures:
            tail = "".join(self._tail).splitlines()[-15:]
            return JobStatus(state, code or 1, f"mpirun ended with {describe_exit(code)} and {len(records)} of "
                             f"{self.world_size} ranks reported an exit; last lines of {self.log_path}:\n"
                             + "\n".join("    " + ln for ln in tail))
        first = failures[0]
        log = Path(first["log"])
        try:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        except OSError:
            tail = ["(no log)"]
        others = [f"rank {r['rank']}: {describe_exit(r['code'])}" for r in records if r is not first]
        missing = sorted(set(range(self.world_size)) - {r["rank"] for r in records})
        if missing:
            others.append(f"ranks {missing}: killed before they could report")
        message = (f"rank {first['rank']} (node {first['node']}) failed first, with {describe_exit(first['code'])}; "
                   f"last lines of {log}:\n" + "\n".join("    " + ln for ln in tail)
                   + (f"\n  then {'; '.join(others)}" if others else ""))
        return JobStatus(state, first["code"], message)

    def cancel(self) -> None:
        if self.proc.poll() is not None or self._cancelled:
            return
        self._cancelled = True
        threading.Thread(target=self._terminate, name=f"ddlkit-mpi-cancel-{self.id}", daemon=True).start()

    def _terminate(self) -> None:
        """SIGTERM to every rank minder (mpirun's children), including ranks that are still
        starting, then SIGKILL to the whole session once the grace period is over."""
        deadline = time.monotonic() + self.grace
        signalled: set[int] = set()
        while self.proc.poll() is None and time.monotonic() < deadline:
            for pid, ppid, _ in _processes():
                if ppid == self.proc.pid and pid not in signalled:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        continue
                    signalled.add(pid)
            time.sleep(0.1)
        if self.proc.poll() is None:
            kill_session(self.proc.pid, signal.SIGKILL)


class LocalMpiTarget(ddlkit.ComputeTarget):
    cfg: LocalMpiConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        for key in ("nodes", "procs_per_node"):
            if getattr(cfg, key) < 1:
                raise ddlkit.ConfigError(f"compute.{key}={getattr(cfg, key)} is invalid: it must be a positive integer.")
        if shutil.which(cfg.mpirun) is None:
            raise ddlkit.ConfigError(f"compute=local_mpi needs OpenMPI's `{cfg.mpirun}`, which is not on PATH: "
                                     "apt-get install openmpi-bin (or set compute.mpirun to its path).")

    @property
    def world_size(self) -> int:
        return self.cfg.nodes * self.cfg.procs_per_node

    def command(self, spec: JobSpec) -> list[str]:
        c = self.cfg
        scratch = Path(c.scratch).expanduser() if c.scratch else spec.job_dir / "nodes"
        return [
            c.mpirun, "-np", str(self.world_size),
            # a simulation on one machine: ranks may outnumber cores (and OpenMPI counts physical
            # cores), and no rank is pinned, so the OS spreads them
            "--oversubscribe", "--bind-to", "none", "--map-by", "slot",
            *c.mpirun_args,
            sys.executable, "-m", "ddlkit_mpi.rank", "--job-dir", str(spec.job_dir),
            "--procs-per-node", str(c.procs_per_node), "--scratch", str(scratch), "--", *spec.argv,
        ]

    def environment(self, spec: JobSpec) -> dict[str, str]:
        master_port, control_port = free_ports(2)
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1",
               # rendezvous on loopback: torch.distributed's store, and ddlkit's control plane
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
               "DDLKIT_CONTROL_ADDR": f"127.0.0.1:{control_port}"}
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # like torchrun: ranks sharing a machine share its cores instead of each taking them all
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.world_size)))
        # a rank waiting in an MPI collective (Horovod's all-reduce) busy-polls; on a machine whose
        # cores all train, that steals the core another rank computes on. Yielding doubled Horovod's
        # 2-rank throughput on 2 cores (OpenMPI yields by itself only when ranks outnumber slots)
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        if os.geteuid() == 0:
            # containers run as root; OpenMPI refuses that unless told both of these
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env

    def submit(self, spec: JobSpec) -> JobHandle:
        # a resumed job runs in the same directory: the previous run's exit records are not ours
        shutil.rmtree(spec.job_dir / RECORDS_DIR, ignore_errors=True)
        proc = subprocess.Popen(self.command(spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.environment(spec), start_new_session=True)
        return MpiJobHandle(proc, spec, self.cfg, self.world_size)
