"""Hang forensics: the stacks of every rank, written when one of them falls silent.

When rank 0 has not heard from a rank for ``dist.warn_after_s`` (:mod:`.control_plane`), it asks
every rank that still answers to write the Python stacks of all its threads (``faulthandler``),
and with them its native frames where ``py-spy`` is installed, to ``<job dir>/hang/rank-N.txt``,
headed by the step and the phase the rank was in and the control-plane collective it waits in.
A rank that does not answer -- stopped (SIGSTOP), or hung with the interpreter's lock held --
cannot write its own; a rank on its host reads it from outside with ``py-spy`` (rank 0 on its own host,
else the first rank there that answers).
The console then names the ranks that are not where the others wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import shutil
import subprocess
import time
from pathlib import Path

#: the directory of the stack files, in the job directory
HANG_DIR = "hang"
#: seconds py-spy may take to read a process
_PY_SPY_TIMEOUT_S = 10.0
#: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): lets py-spy, a child of this process, read it where
#: Yama allows a process to be traced only by its ancestors (ptrace_scope 1, Ubuntu's default)
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1)


def stack_file(job_dir: Path, rank: int) -> Path:
    return Path(job_dir) / HANG_DIR / f"rank-{rank}.txt"


def write_own_stacks(path: Path, header: str) -> None:
    """``header``, then this process's Python stacks (every thread) and its native frames where
    py-spy is installed, written whole to ``path`` (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{header}\n\n## Python stacks, every thread (faulthandler), most recent call first\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.write("\n" + py_spy(os.getpid(), own=True))
    os.replace(tmp, path)


def write_stacks_of(path: Path, pid: int, header: str) -> None:
    """What py-spy reads of another process that does not answer (without stopping it further)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    tmp.write_text(f"{header}\n\n{py_spy(pid, own=False)}", encoding="utf-8")
    os.replace(tmp, path)


def py_spy(pid: int, *, own: bool) -> str:
    """``py-spy dump`` of ``pid`` as a section of a stack file: with native frames for this
    process; for another, one that does not answer, its Python stacks read as they stand (py-spy
    cannot suspend a stopped process, nor read native frames without suspending it); a line saying
    why not where py-spy is not installed or cannot read it."""
    exe = shutil.which("py-spy")
    if exe is None:
        return "## native frames: py-spy is not installed here (pip install py-spy)\n"
    argv = [exe, "dump", "--pid", str(pid), "--native" if own else "--nonblocking"]
    what = " ".join(argv[1:2] + argv[4:])
    if own:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_PY_SPY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"## py-spy {what}: no answer within {_PY_SPY_TIMEOUT_S:g} s\n"
    took = time.monotonic() - start
    if done.returncode != 0:
        why = " ".join((done.stderr or done.stdout).split())[:300]
        return f"## py-spy {what} failed ({why}): run as root, or with ptrace allowed (CAP_SYS_PTRACE)\n"
    return f"## py-spy {what} ({took:.1f} s)\n{done.stdout}"
