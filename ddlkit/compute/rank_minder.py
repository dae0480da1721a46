"""The rank minder: what a compute target starts once per rank, with the ddlkit worker as its child.

A target's rank entry (``python -m ddlkit_mpi.rank ... -- COMMAND...`` under mpirun,
``python -m ddlkit_slurm.rank -- COMMAND...`` under srun) does only what differs between
targets: it parses its arguments, learns the rank's place in the job from whatever started it
(OpenMPI's ``OMPI_COMM_WORLD_*``, Slurm's ``SLURM_*``, a pod's index, ...) and turns it into the
worker's variables, then hands over::

    minder.forward_signals()            # first: a stop request while starting must not kill the rank
    variables = layout(os.environ)      # the target's part: {"DDLKIT_NODE": "1", ...}
    return minder.run(command, rank=rank, variables=variables, name="ddlkit_k8s")

What :func:`run` guarantees, the same for every target:

* **layout**: the child runs with this process's environment plus ``variables``, which must
  include ddlkit's node layout (:data:`ddlkit.compute.layout.LAYOUT_VARIABLES`, best written with
  :class:`~ddlkit.compute.layout.RankLayout`; :class:`ddlkit.DistContext` prefers them over anything else), and
  whatever else the target's ranks need (torch's ``RANK``/``WORLD_SIZE``, ``DDLKIT_NODE_SCRATCH``, ...);
* **logs**: everything the child prints, stdout and stderr, is appended to ``rank-N.log``
  (:func:`ddlkit.jobdir.rank_log`) in the job directory as it comes;
* **console**: rank 0's stdout and stderr pass through to this process's own (the target's
  console: mpirun's output, the batch job's output, a pod's log); every other rank passes on only
  its error lines (:class:`ErrorFilter`: lines naming an error, whole tracebacks, the control
  plane's liveness warnings), prefixed ``[rank N]``, on stderr. A rank that ends with a non-zero
  status says so (``[rank N] ended with exit status 1``); with ``tail_lines``, a rank other than 0
  that *failed* (not :data:`~ddlkit.jobdir.EXIT_PREEMPTED`) also repeats the last lines of its
  output the console has not shown -- for a target whose launcher reads only the console;
* **exit record**: once the child ended, ``.ranks/rank-N.json`` (:func:`ddlkit.jobdir.rank_record`,
  replaced atomically) says how and when: ``rank``, ``node``, ``local_rank``, ``code`` (the exit
  status; minus the signal's number when a signal ended it), ``time`` (when, in seconds since the
  epoch), ``log`` (relative to the job directory), ``pid`` and ``host``; for a rank that SIGKILL
  ended, ``oom_killed``: whether the kernel's out-of-memory killer did (:func:`oom_kill_counter`;
  null where that cannot be read). A launcher names the rank that failed *first* from these (a
  failed rank makes the others fail too, later): :func:`ddlkit.compute.rank_exits.first_failure`;
* **signals** (from :func:`forward_signals` on): SIGTERM, SIGINT and SIGUSR1 reach the child as
  one SIGTERM, the worker's one stop request (it checkpoints at its next step and exits
  ``EXIT_PREEMPTED``); SIGUSR1 is what mpirun forwards to every rank on every host, SIGINT what
  a terminal sends; later ones are not passed on. A signal that comes before the child started
  is delivered once it has; with ``cancel_file``, a rank that starts after the job was cancelled
  is stopped at once (the stop signal may have come before this process existed);
* **no orphans**: the child runs in a process group of its own and is killed when this process
  dies (``PR_SET_PDEATHSIG``); when the child has ended, whatever is left in its group is killed;
  when this process's parent (mpirun, slurmstepd) goes away while the child runs, the child is
  killed, since nobody would collect it;
* **exit status**: the child's; a death by signal N as ``128 + N`` (the shell's way), never 0.

Standard library only, and nothing of the ddlkit package but :mod:`ddlkit.jobdir` (which imports
nothing): it starts once per rank before the worker and lives as long as the rank, so it holds
none of the training stack (pluggy, OmegaConf: ``import ddlkit`` loads its names lazily), and a
worker that fails to import what it needs is reported, not shared by its minder.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence

from .. import jobdir
from ._minder import oom_kills
from .layout import LAYOUT_VARIABLES, LOCAL_RANK_ENV, NODE_ENV

#: lines of a rank's stderr that name an error
ERROR_LINE = re.compile(
    rb"\b(error|exception|traceback|fatal|killed|aborted|segmentation fault|out of memory)\b", re.IGNORECASE
)
#: and the control plane's word that a rank stopped answering, or answers again (ddlkit.rank.distributed):
#: when rank 0 is the silent one, only the other ranks can say so
LIVENESS_LINE = re.compile(rb"^ddlkit: rank \d+ (has not been heard from|is answering again)")
#: after the child ended, how long pipes a leftover of it may hold open are still read
_DRAIN_S = 2.0
_PR_SET_PDEATHSIG = 1


class ErrorFilter:
    """Picks a rank's error lines out of its stderr: lines that name an error, whole Python
    tracebacks (up to and including the exception line) and liveness warnings."""

    def __init__(self) -> None:
        self.partial = b""
        self.in_traceback = False

    def wants(self, line: bytes) -> bool:
        """Whether ``line`` (the next whole line, without its newline) is an error line."""
        if line.startswith(b"Traceback (most recent call last)"):
            self.in_traceback = True
        wanted = self.in_traceback or bool(ERROR_LINE.search(line)) or bool(LIVENESS_LINE.match(line))
        if self.in_traceback and line and not line[:1].isspace() and not line.startswith(b"Traceback"):
            self.in_traceback = False  # the exception line ends the traceback
        return wanted

    def feed(self, data: bytes) -> list[bytes]:
        """The error lines completed by ``data``, the next chunk of the stream."""
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return [line for line in lines if self.wants(line)]


#: the stop signals a rank gets (mpirun forwards SIGUSR1 to every rank on every host; SIGINT: a terminal)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: the child, once started (a list, so that the signal handler sees it)
_started: list[subprocess.Popen[bytes]] = []
#: whether the rank was asked to stop: the child is asked once, as soon as it has started
_stop_requested = False


def forward_signals() -> None:
    """From now on the stop signals reach the child as one SIGTERM, held until it has started. A
    rank entry calls this first, before its own work: without it, a stop request that comes while
    the rank starts would kill the minder, and nobody would report the rank."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _forward)


def entry_command(argv: Sequence[str], module: str) -> list[str] | None:
    """The worker's command in a rank entry's arguments (``python -m MODULE -- COMMAND...``, the
    ``--`` optional); None, with the usage said on stderr, when there is none."""
    command = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not command:
        print(f"usage: python -m {module} -- COMMAND...", file=sys.stderr)
        return None
    return command


def _forward(signum: int, frame: object) -> None:
    """To the child only, not its process group: the worker decides how to stop (it checkpoints
    at the next step); its helpers are killed when it has ended. Always as SIGTERM: the worker
    handles no other stop signal (a SIGINT would end it in a KeyboardInterrupt, unsaved). Once:
    a repeated request says nothing new (mpirun aborting the job after a cancel, a second scancel),
    and could only kill a worker that is saving its checkpoint or exiting after it."""
    global _stop_requested
    if _stop_requested:
        return
    _stop_requested = True
    if _started:
        try:
            os.kill(_started[0].pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it if this minder dies (an MPI abort kills the minder's
    process group, which the child has left so that its own leftovers can be killed apart)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _unescape(field: str) -> str:
    """A path as /proc/self/mountinfo writes it (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """The cgroup file systems mounted here: (type, root in the hierarchy, mount point, options)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) >= 5 and len(after) >= 3 and after[0] in ("cgroup", "cgroup2"):
            mounts.append((after[0], _unescape(fields[3]), _unescape(fields[4]), set(after[2].split(","))))
    return mounts


def _in_mount(point: str, root: str, path: str, name: str) -> str | None:
    """File ``name`` of cgroup ``path`` in a hierarchy mounted at ``point`` from its ``root``."""
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return None  # the cgroup is not below what this mount shows
        path = path[len(root) :]
    return os.path.join(point, path.lstrip("/"), name)


def oom_kill_counter(pid: int | str = "self") -> str | None:
    """The file that counts the kernel's out-of-memory kills in process ``pid``'s memory cgroup,
    None where none can be read (no cgroup file system, no memory controller, a kernel older than
    4.13). cgroup v1 (``N:memory:/path`` in ``/proc/<pid>/cgroup``): ``memory.oom_control``'s
    ``oom_kill``; v2 (``0::/path``): ``memory.events``' ``oom_kill``. The kernel counts a kill on the
    victim's memory cgroup whether the cgroup's limit or the machine ran out (a global OOM), so a
    rise while a process of the cgroup died of SIGKILL is the OOM killer's verdict -- on the cgroup,
    not the process: another process of it killed at the same moment is counted alike."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    mounts = _cgroup_mounts()
    candidates: list[str | None] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):  # v1 (listed before v2's line: on a hybrid machine, it counts)
            candidates += [_in_mount(p, r, path, "memory.oom_control") for t, r, p, o in mounts if "memory" in o]
            candidates.append(_in_mount("/sys/fs/cgroup/memory", "/", path, "memory.oom_control"))
        elif hierarchy == "0" and not controllers:
            candidates += [_in_mount(p, r, path, "memory.events") for t, r, p, o in mounts if t == "cgroup2"]
            candidates.append(_in_mount("/sys/fs/cgroup", "/", path, "memory.events"))
    return next((c for c in candidates if c is not None and oom_kills(c) is not None), None)


def _describe(code: int) -> str:
    """How a child ended, from its exit code (negative: the signal)."""
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def run(
    command: Sequence[str],
    *,
    rank: int,
    variables: Mapping[str, str],
    name: str,
    job_dir: str = ".",
    cancel_file: str | None = None,
    tail_lines: int = 0,
) -> int:
    """Run ``command`` (the worker) as rank ``rank`` with ``variables`` added to its environment,
    and mind it as the module's docstring says; returns this process's exit status.

    ``name`` tags the minder's own line in the rank's log (the target's, e.g. ``ddlkit_mpi``);
    ``job_dir`` is where the logs and records go (the ranks run in the job directory: ``.``);
    ``cancel_file``: the job's cancel marker (relative: to ``job_dir``): a rank that starts after it
    was written is stopped at once; ``tail_lines``: how many of a failed rank's last lines the
    console gets that it has not seen (0: its error lines are enough, the launcher reads the log).
    """
    missing = [key for key in LAYOUT_VARIABLES if key not in variables]
    if missing:
        raise ValueError(
            f"the rank's variables lack {', '.join(missing)}: every compute target gives its ranks "
            f"ddlkit's node layout ({', '.join(LAYOUT_VARIABLES)})"
        )
    forward_signals()  # again, for an entry that did not: from here on the rank is reported in any case
    node, local_rank = int(variables[NODE_ENV]), int(variables[LOCAL_RANK_ENV])
    log_name = jobdir.rank_log(rank)
    parent = os.getppid()
    if cancel_file and os.path.exists(os.path.join(job_dir, cancel_file)):
        _forward(signal.SIGTERM, None)  # the job was cancelled before this rank started
    # the OOM kills counted so far in the memory cgroup the child starts in (this process's)
    counter = oom_kill_counter()
    kills_before = oom_kills(counter) if counter is not None else None
    child = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **variables},
        process_group=0,
        preexec_fn=_die_with_parent,
    )
    # held (not the child's mask: it is started) while the child becomes the signals' target, so
    # that a request that comes now reaches it once, not twice nor never
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _started.append(child)
    if _stop_requested:
        os.kill(child.pid, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    out, err = sys.stdout.buffer, sys.stderr.buffer
    errors = ErrorFilter()
    # the last lines of a rank other than 0 that the console has not shown (it shows its error lines)
    unseen: deque[bytes] = deque(maxlen=tail_lines)
    partial = {"stdout": b"", "stderr": b""}

    def pass_on(stream: str, lines: list[bytes]) -> None:
        for line in lines:
            if stream == "stderr" and errors.wants(line):
                err.write(b"[rank %d] %s\n" % (rank, line))
                unseen.clear()
            else:
                unseen.append(line)
        err.flush()

    sel = selectors.DefaultSelector()
    assert child.stdout is not None and child.stderr is not None
    sel.register(child.stdout, selectors.EVENT_READ, "stdout")
    sel.register(child.stderr, selectors.EVENT_READ, "stderr")
    ended_at: float | None = None
    ended_wall: float | None = None
    with open(os.path.join(job_dir, log_name), "ab") as log:
        # until both pipes close; a leftover of the child may hold them open, so after the child
        # has ended its process group is killed, and the pipes get a moment
        while sel.get_map() and (ended_at is None or time.monotonic() - ended_at < _DRAIN_S):
            for key, _ in sel.select(timeout=0.2):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    if partial[key.data]:
                        pass_on(key.data, [partial[key.data]])
                    continue
                log.write(data)
                log.flush()
                if rank == 0:
                    stream = out if key.data == "stdout" else err
                    stream.write(data)
                    stream.flush()
                else:
                    lines = (partial[key.data] + data).split(b"\n")
                    partial[key.data] = lines.pop()
                    pass_on(key.data, lines)
            if ended_at is None and child.poll() is not None:
                ended_at, ended_wall = time.monotonic(), time.time()
                _kill_group(child.pid)
            if os.getppid() != parent and child.poll() is None:
                # whatever started this rank is gone: nobody will collect it, so end it
                _kill_group(child.pid)
        code = child.wait()
        finished = ended_wall or time.time()
        _kill_group(child.pid)
        oom_killed: bool | None = None
        if code == -signal.SIGKILL and counter is not None and kills_before is not None:
            kills_after = oom_kills(counter)
            oom_killed = None if kills_after is None else kills_after > kills_before
        how = _describe(code) + (
            " (the out-of-memory killer: its memory cgroup counted an OOM kill)" if oom_killed else ""
        )
        if code != 0:
            log.write(f"[{name}] rank {rank} (node {node}) ended with {how}\n".encode())
            failed = code not in (jobdir.EXIT_COMPLETED, jobdir.EXIT_PREEMPTED)
            if rank != 0 and failed and unseen:
                err.write(f"[rank {rank}] ended with {how}; last lines of {log_name}:\n".encode())
                err.write(b"".join(b"[rank %d] %s\n" % (rank, line) for line in unseen))
            else:
                err.write(f"[rank {rank}] ended with {how}\n".encode())
            err.flush()
    _write_record(
        job_dir,
        rank,
        {
            "rank": rank,
            "node": node,
            "local_rank": local_rank,
            "code": code,
            "time": finished,
            "log": log_name,
            "pid": child.pid,
            "host": os.uname().nodename,
            **({"oom_killed": oom_killed} if code == -signal.SIGKILL else {}),
        },
    )
    return 128 - code if code < 0 else code


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _write_record(job_dir: str, rank: int, record: dict[str, object]) -> None:
    path = os.path.join(job_dir, jobdir.rank_record(rank))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)  # the launcher never reads half a record
