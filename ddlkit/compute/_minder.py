"""Runs one job's command on this machine and leaves what a launcher needs to find it later.

    python -I -S _minder.py LOG EXIT_FILE CANCEL_FILE DETACHED_FILE GRACE_S STOP_SIGNAL OOM_COUNTER -- COMMAND...

(the files are relative to the working directory, the job directory: :mod:`ddlkit.jobdir` names them)

* COMMAND's output (stdout and stderr) is appended to LOG by COMMAND itself: nothing sits in a
  pipe to the launcher, so a detached job outlives its launcher;
* when COMMAND ends, ``{"code": N, "time": T}`` is written to EXIT_FILE (atomically): its exit
  code, negative for a signal, which a process that is not this one's parent cannot learn otherwise;
  when SIGKILL ended it, ``"oom_killed"`` too: whether OOM_COUNTER (the file that counts the kernel's
  out-of-memory kills in the memory cgroup COMMAND starts in, ``-`` where none can be read) counted
  one meanwhile (ddlkit.compute.rank_minder.oom_kill_counter finds it);
* SIGTERM and SIGINT are passed to COMMAND (it decides how to stop: a ddlkit worker checkpoints),
  after CANCEL_FILE is written: someone stopped the job, which is not restarted;
* if the launcher that started it dies (even by SIGKILL) before it detached the job (DETACHED_FILE
  says it did), CANCEL_FILE is written, as a cancel does, and COMMAND gets STOP_SIGNAL (a
  number: SIGTERM for a worker; mpirun passes SIGUSR1 on to its ranks), and SIGKILL GRACE_S
  seconds later: a job nobody watches does not run on by mistake;
* whatever COMMAND left running in its process group is killed once it has ended;
* should the minder itself be killed (``kill -9`` of the job's id, which is its pid), a guard it
  forked first -- in the job's session, in a process group of its own, told of the minder's end
  by a pipe the kernel closes -- kills every process of the session and records the end: a
  job's processes never train on unseen.

Standard library only, and started with ``-I -S``: it reads no site-packages (``-S``: not even
their ``.pth`` files, a fifth of an interpreter's start), so it starts in milliseconds and the
job's environment cannot change it. That is why the job
directory's file names come as arguments from the launcher rather than from ``ddlkit.jobdir``.
Its exit status is COMMAND's (128 + N for signal N).
"""

import json
import os
import signal
import subprocess
import sys
import time

#: seconds between looks at the launcher
_WATCH_S = 0.5
#: seconds the guard keeps killing a killed minder's session (processes may fork meanwhile)
_KILL_FOR_S = 30.0


def _session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``, from /proc (as ddlkit.compute.process reads
    them; the minder imports nothing from ddlkit)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(name))
    return members


def _write_exit(exit_path: str, code: int, ended: float, oom_killed: bool | None = None) -> None:
    tmp = f"{exit_path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"code": code, "time": ended, **({} if oom_killed is None else {"oom_killed": oom_killed})}, f)
    os.replace(tmp, exit_path)


def oom_kills(counter: str) -> int | None:
    """The ``oom_kill`` count in ``counter`` (:func:`ddlkit.compute.rank_minder.oom_kill_counter`),
    None where it cannot be read. Defined here because this minder runs on the standard library
    alone; the rank minder imports it from here."""
    try:
        with open(counter, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _guard(done: int, log_path: str, exit_path: str) -> None:
    """The forked guard: wait for the minder's end; unless it said it ended normally (one byte
    on the pipe; a killed minder's pipe just closes), kill the whole session and record the end."""
    os.setpgid(0, 0)  # `kill -9 -<id>` (the minder's process group) spares the guard
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a cancel signals the session; the guard stays to the end
    minder = os.getppid()
    try:
        if os.read(done, 1):
            return
    except OSError:
        pass
    with open(log_path, "ab", buffering=0) as log:
        log.write(f"ddlkit: this job's minder (id {minder}) was killed; killing the job's processes\n".encode())
    me, sid, deadline = os.getpid(), os.getsid(0), time.monotonic() + _KILL_FOR_S
    while (others := [pid for pid in _session_members(sid) if pid != me]) and time.monotonic() < deadline:
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    if not os.path.exists(exit_path):  # a minder killed after it recorded the end leaves that record
        _write_exit(exit_path, -signal.SIGKILL, time.time())


def main(argv: list[str]) -> int:
    log_path, exit_path, cancel_path, detached_path, grace, stop_signal, oom_counter, sep, *command = argv
    if sep != "--" or not command:
        print(
            "usage: python -I _minder.py LOG EXIT_FILE CANCEL_FILE DETACHED_FILE GRACE_S STOP_SIGNAL OOM_COUNTER "
            "-- COMMAND...",
            file=sys.stderr,
        )
        return 2
    kills_before = None if oom_counter == "-" else oom_kills(oom_counter)
    launcher = os.getppid()
    # the guard first: from here on, a killed minder does not leave the job running
    done_read, done_write = os.pipe()
    guard = os.fork()
    if guard == 0:
        os.close(done_write)
        try:
            _guard(done_read, log_path, exit_path)
        finally:
            os._exit(0)
    os.close(done_read)
    with open(log_path, "ab", buffering=0) as log:
        # its own process group: what it leaves behind can be killed without killing this minder
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0
        )

    def forward(signum: int, frame: object = None) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    def stop(signum: int, frame: object = None) -> None:
        # a TERM or INT to the job's id (``kill <id>``, ProcessJob.cancel) is someone stopping the job:
        # marked as a cancel does, its end is a stop, never a pre-emption the restart policy restarts
        if not os.path.exists(cancel_path):
            with open(cancel_path, "w", encoding="utf-8") as f:
                f.write(f"{time.time()} signal {signum} to the job's minder\n")
        forward(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    orphaned_at = None
    while True:
        try:
            code = child.wait(timeout=_WATCH_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if orphaned_at is None and os.getppid() != launcher and not os.path.exists(detached_path):
            orphaned_at = time.monotonic()
            with open(log_path, "ab", buffering=0) as log:
                log.write(b"ddlkit: the launcher of this job is gone; asking the job to checkpoint and stop\n")
            # what ProcessJob.cancel() writes too: the job's end is then a cancellation, not a failure
            with open(cancel_path, "w", encoding="utf-8") as f:
                f.write(f"{time.time()} launcher gone\n")
            forward(int(stop_signal))
        elif orphaned_at is not None and time.monotonic() - orphaned_at > float(grace):
            forward(signal.SIGKILL)
    ended = time.time()
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    oom_killed = None
    if code == -signal.SIGKILL and kills_before is not None:
        kills_after = oom_kills(oom_counter)
        oom_killed = None if kills_after is None else kills_after > kills_before
    _write_exit(exit_path, code, ended, oom_killed)
    try:
        os.write(done_write, b"x")  # the guard's leave to go
    except OSError:
        pass  # killed with the session by a cancel's last resort
    os.waitpid(guard, 0)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
