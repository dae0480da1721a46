"""What ``srun`` starts for every task of a ``compute=slurm`` job:
``python -m ddlkit_slurm.rank -- COMMAND...``, in the job directory.

It runs COMMAND (the ddlkit worker) as its child and is the rank's minder:

* **rank layout**: Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``
  and ``SLURM_STEP_TASKS_PER_NODE`` become what :class:`ddlkit.DistContext` and torch.distributed
  read (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``DDLKIT_NODE``, ``DDLKIT_LOCAL_RANK``, ``DDLKIT_LOCAL_SIZE``);
* **logs**: the child's output goes to ``rank-N.log`` in the job directory; rank 0's output also
  goes to this process's stdout, which srun writes to the batch job's output (``slurm.log``), the
  file the launcher follows; another rank that fails prints its last lines there, prefixed;
* **signals**: SIGTERM, SIGINT and SIGUSR1 reach the child as SIGTERM (the worker checkpoints at
  its next step and exits ``EXIT_PREEMPTED``); the child dies with this process (``PR_SET_PDEATHSIG``), and
  whatever it left running in its process group is killed when it ends.

Standard library only, and nothing of the ddlkit package but its job-directory protocol (one file,
loaded by its path): it starts once per rank before the worker.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import selectors
import signal
import subprocess
import sys
from collections import deque
from types import ModuleType

_PR_SET_PDEATHSIG = 1


def _load_jobdir() -> ModuleType:
    """:mod:`ddlkit.jobdir`, the file names and exit codes of the job directory, loaded from its file:
    ``import ddlkit.jobdir`` would import the ddlkit package (pluggy, OmegaConf, ...) first, and
    jobdir.py imports nothing."""
    package = importlib.util.find_spec("ddlkit")  # locates the package without importing it
    assert package is not None and package.submodule_search_locations, "ddlkit is not installed"
    spec = importlib.util.spec_from_file_location(
        "_ddlkit_jobdir", os.path.join(package.submodule_search_locations[0], "jobdir.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


jobdir = _load_jobdir()
#: the worker, once started; signals that came before it
started: list[subprocess.Popen[bytes]] = []
pending: list[int] = []


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed task counts, ``"4(x2),2"`` -> ``[4, 4, 2]``."""
    sizes: list[int] = []
    for part in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"cannot read tasks per node {spec!r}")
        sizes += [int(m.group(1))] * int(m.group(2) or 1)
    return sizes


def layout(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The ranks' variables from Slurm's (a task of ``srun``)."""
    rank, world = int(env["SLURM_PROCID"]), int(env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or 1)
    local_rank, node = int(env.get("SLURM_LOCALID", 0)), int(env.get("SLURM_NODEID", 0))
    try:
        local_size = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""))[node]
    except (ValueError, IndexError):
        local_size = int(env.get("SLURM_NTASKS_PER_NODE") or 1)
    values = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": local_size,
              "GROUP_RANK": node, "DDLKIT_NODE": node, "DDLKIT_LOCAL_RANK": local_rank,
              "DDLKIT_LOCAL_SIZE": local_size}
    return {k: str(v) for k, v in values.items()}


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _forward(signum: int, frame: object) -> None:
    if not started:
        pending.append(signal.SIGTERM)
        return
    try:
        os.kill(started[0].pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, _forward)
    argv = sys.argv[1:] if argv is None else argv
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m ddlkit_slurm.rank -- COMMAND...", file=sys.stderr)
        return 2
    ranks = layout(os.environ)
    rank = int(ranks["RANK"])
    env = {**os.environ, **ranks}
    tail: deque[bytes] = deque(maxlen=15)
    with open(jobdir.rank_log(rank), "ab", buffering=0) as log:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, process_group=0, preexec_fn=_die_with_parent)
        started.append(child)
        for sig in pending:
            os.kill(child.pid, sig)
        out = sys.stdout.buffer
        os.set_blocking(child.stdout.fileno(), False)
        sel = selectors.DefaultSelector()
        sel.register(child.stdout, selectors.EVENT_READ)
        partial = b""

        def pump() -> bool:
            nonlocal partial
            try:
                data = os.read(child.stdout.fileno(), 65536)
            except BlockingIOError:
                return True
            if not data:
                return False
            log.write(data)
            if rank == 0:
                out.write(data)
                out.flush()
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            tail.extend(lines)
            return True

        open_ = True
        # a helper the child started may hold the pipe after the child ended: stop reading then
        while open_ and child.poll() is None:
            if sel.select(timeout=0.2):
                open_ = pump()
        code = child.wait()
        while open_ and sel.select(timeout=0):
            open_ = pump()
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if rank != 0 and code not in (jobdir.EXIT_COMPLETED, jobdir.EXIT_PREEMPTED):
        lines = [*tail, partial] if partial else list(tail)
        text = "".join(f"[rank {rank}] {ln.decode(errors='replace')}\n" for ln in lines)
        out.write(f"[rank {rank}] exited with code {code}; last lines of {jobdir.rank_log(rank)}:\n{text}".encode())
        out.flush()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
