"""A plain Hydra task function run as a job: Hydra's ``run_job`` in a forked child of the launcher.

Forking (not spawning) is what lets any task function run this way: closures, resolvers
registered at run time and Hydra's singletons are inherited instead of pickled. The child sends
its :class:`~hydra.core.utils.JobReturn` back through a pipe; its output goes straight to the
launcher's own stdout and stderr, which it inherits.
"""

from __future__ import annotations

import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait

from hydra.core.utils import JobReturn
from hydra.core.utils import JobStatus as TaskStatus

from ...interfaces import JobHandle, JobState, JobStatus


class TaskError(RuntimeError):
    """Stands in for a task's exception that could not be sent back from the child (not picklable)."""


def _child(run: Callable[[], JobReturn], conn: Connection) -> None:
    ret = run()
    try:
        payload = pickle.dumps(ret)
    except Exception as err:
        value = ret._return_value
        detail = "".join(traceback.format_exception(value)) if isinstance(value, BaseException) else repr(value)
        ret._return_value = TaskError(f"the job's return value could not be sent to the launcher ({err}):\n{detail}")
        ret.status = TaskStatus.FAILED
        payload = pickle.dumps(ret)
    conn.send_bytes(payload)
    conn.close()


class ForkedTaskHandle(JobHandle):
    """``run`` (Hydra's ``run_job`` for one job) executing in a forked child process."""

    def __init__(self, run: Callable[[], JobReturn], name: str) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child_conn = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(run, child_conn), name=name)
        self._proc.start()
        child_conn.close()
        self.id = f"{name}:{self._proc.pid}"
        #: the child's JobReturn, once it has sent it
        self.job_return: JobReturn | None = None
        self._eof = False
        self._cancelled = False

    def _receive(self) -> None:
        # read as soon as data is there: a large JobReturn blocks the child until it is read
        while not self._eof and self._conn.poll():
            try:
                self.job_return = pickle.loads(self._conn.recv_bytes())
            except EOFError:
                self._eof = True
                self._conn.close()

    def status(self) -> JobStatus:
        self._receive()
        code = self._proc.exitcode
        if code is None:
            return JobStatus(JobState.RUNNING)
        self._receive()
        if self._cancelled:
            return JobStatus(JobState.CANCELLED, code, "cancelled")
        ret = self.job_return
        if code != 0 or ret is None:
            return JobStatus(
                JobState.FAILED, code, f"the task's process ended with exit status {code} before returning"
            )
        if ret.status is TaskStatus.COMPLETED:
            return JobStatus(JobState.SUCCEEDED, 0)
        value = ret._return_value
        return JobStatus(JobState.FAILED, 0, f"the task raised {type(value).__name__}: {value}")

    def logs(self, follow: bool = True) -> Iterator[str]:
        """Nothing: the child writes to the launcher's own stdout and stderr, inherited at fork."""
        return iter(())

    def cancel(self) -> None:
        if self._proc.exitcode is None and not self._cancelled:
            self._cancelled = True
            self._proc.terminate()

    def wait(self, timeout: float | None = None) -> JobStatus:
        if not self._eof:
            wait([self._conn, self._proc.sentinel], timeout)
        self._receive()
        self._proc.join(timeout)
        return self.status()
