"""Runs one job's command on this machine and leaves what a launcher needs to find it later.

    python -I _minder.py LOG EXIT_FILE GRACE_S STOP_SIGNAL -- COMMAND...

* COMMAND's output (stdout and stderr) is appended to LOG by COMMAND itself: nothing sits in a
  pipe to the launcher, so a detached job outlives its launcher;
* when COMMAND ends, ``{"code": N, "time": T}`` is written to EXIT_FILE (atomically): its exit
  code, negative for a signal, which a process that is not this one's parent cannot learn otherwise;
* SIGTERM and SIGINT are passed to COMMAND (it decides how to stop: a ddlkit worker checkpoints);
* if the launcher that started it dies (even by SIGKILL) before it detached the job (the file
  ``.ddlkit/detached`` in the working directory says it did), COMMAND gets STOP_SIGNAL (a
  number: SIGTERM for a worker; mpirun passes SIGUSR1 on to its ranks) as if cancelled, and
  SIGKILL GRACE_S seconds later: a job nobody watches does not run on by mistake;
* whatever COMMAND left running in its process group is killed once it has ended.

Standard library only, and started with ``-I``: it imports nothing from site-packages, so it
starts in milliseconds and the job's environment cannot change it. Its exit status is COMMAND's
(128 + N for signal N).
"""

import json
import os
import signal
import subprocess
import sys
import time

DETACHED_MARKER = os.path.join(".ddlkit", "detached")
#: what ProcessJob.cancel() writes too: the job's end is then a cancellation, not a failure
CANCEL_MARKER = os.path.join(".ddlkit", "cancel-requested")
#: seconds between looks at the launcher
_WATCH_S = 0.5


def main(argv: list[str]) -> int:
    log_path, exit_path, grace, stop_signal, sep, *command = argv
    if sep != "--" or not command:
        print("usage: python -I _minder.py LOG EXIT_FILE GRACE_S STOP_SIGNAL -- COMMAND...", file=sys.stderr)
        return 2
    launcher = os.getppid()
    with open(log_path, "ab", buffering=0) as log:
        # its own process group: what it leaves behind can be killed without killing this minder
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 process_group=0)

    def forward(signum: int, frame: object = None) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    orphaned_at = None
    while True:
        try:
            code = child.wait(timeout=_WATCH_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if orphaned_at is None and os.getppid() != launcher and not os.path.exists(DETACHED_MARKER):
            orphaned_at = time.monotonic()
            with open(log_path, "ab", buffering=0) as log:
                log.write(b"ddlkit: the launcher of this job is gone; asking the job to checkpoint and stop\n")
            with open(CANCEL_MARKER, "w", encoding="utf-8") as f:
                f.write(f"{time.time()} launcher gone\n")
            forward(int(stop_signal))
        elif orphaned_at is not None and time.monotonic() - orphaned_at > float(grace):
            forward(signal.SIGKILL)
    ended = time.time()
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    tmp = f"{exit_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"code": code, "time": ended}, f)
    os.replace(tmp, exit_path)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
