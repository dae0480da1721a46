"""Runs one job's command on this machine and leaves what a launcher needs to find it later.

    python -I _minder.py LOG EXIT_FILE -- COMMAND...

* COMMAND's output (stdout and stderr) is appended to LOG by COMMAND itself: nothing sits in a
  pipe to the launcher, so the job outlives a launcher that detached (or died);
* when COMMAND ends, ``{"code": N, "time": T}`` is written to EXIT_FILE (atomically): its exit
  code, negative for a signal, which a process that is not this one's parent cannot learn otherwise;
* SIGTERM and SIGINT are passed to COMMAND (it decides how to stop: a ddlkit worker checkpoints);
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


def main(argv: list[str]) -> int:
    log_path, exit_path, sep, *command = argv
    if sep != "--" or not command:
        print("usage: python -I _minder.py LOG EXIT_FILE -- COMMAND...", file=sys.stderr)
        return 2
    with open(log_path, "ab", buffering=0) as log:
        # its own process group: what it leaves behind can be killed without killing this minder
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 process_group=0)

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = child.wait()
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
