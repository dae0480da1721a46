"""The minder of a detached job (``ddlkit --detach``): a process of its own that outlives the launcher
and drives the job's :class:`~ddlkit.launch.controller.JobController` to its end, so that a detached
job is restarted under its restart policy as a followed one is -- the same controller, the same rule
for how a run ended, the same record -- and is settled (files collected, end recorded) when it ends.

The launcher hands the minder the prepared job in a file readable by the job's user alone (it holds
the job's secrets, which a restart hands to the ranks again), which the minder removes as soon as it
has read it; what the minder says (each restart, its end) goes to ``.ddlkit/minder.log`` in the job
directory, and each restart into the job's record (``ddlkit jobs status``).

Its command: ``python -m ddlkit.launch.minder <job dir>/.ddlkit/minder.job``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..errors import DdlkitError
from ..jobdir import STATE_DIR
from .prepare import PreparedJob

#: the prepared job, for the minder's eyes only (removed once read)
JOB_PICKLE = f"{STATE_DIR}/minder.job"
#: what the minder says
MINDER_LOG = f"{STATE_DIR}/minder.log"


def start(job: PreparedJob, job_id: str) -> int:
    """Start the minder of the detached job ``job`` (submitted as ``job_id``); returns its pid."""
    job_dir = Path(job.spec.job_dir)
    path = job_dir / JOB_PICKLE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    # the target is built again from the job file, as `ddlkit jobs` does: it may hold clients that do not pickle
    payload = (replace(job, compute=None), job_id)  # type: ignore[arg-type]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(payload, f)
    with open(job_dir / MINDER_LOG, "ab") as log:
        minder = subprocess.Popen(
            [sys.executable, "-m", __name__, str(path)],
            cwd=job_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the launcher's terminal, or its end, is not the minder's
        )
    return minder.pid


def main(path: str) -> int:
    from ..plugins import installed_registry
    from . import index
    from .controller import JobController, Restarts, restart_policy

    with open(path, "rb") as f:
        job, job_id = pickle.load(f)
    os.unlink(path)
    job = replace(job, compute=index.load(job.spec.job_dir).compute_target(installed_registry()))
    out = sys.stdout
    handle = job.compute.attach(job_id, job_dir=job.spec.job_dir)
    life = JobController(handle, job.spec.job_dir, Restarts(job, restart_policy(job, out), detach=True))
    out.write(f"ddlkit: minding job {job.spec.name} ({job_id}) for its restarts\n")
    out.flush()
    try:
        while not (status := life.step()).state.done:
            time.sleep(max(job.compute.status_interval_s, life.next_step_in()))
    except DdlkitError as err:  # e.g. the ended job's files could not be brought back: the error says how to
        out.write(f"ddlkit: error: {err}\n")
        return 1
    why = f" ({life.why_not})" if life.why_not else ""
    out.write(f"ddlkit: job {job.spec.name} {status.state.value}{why}\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1]))
