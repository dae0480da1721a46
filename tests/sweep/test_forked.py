"""A plain Hydra task's job as a forked child: its JobReturn comes back, whatever the task did."""

from __future__ import annotations

import os
import time

import pytest
from hydra.core.utils import JobReturn
from hydra.core.utils import JobStatus as TaskStatus

from ddlkit import JobState
from ddlkit.launch.sweep.forked import ForkedTaskHandle, TaskError


def job_return(status: TaskStatus, value: object) -> JobReturn:
    ret = JobReturn(overrides=["x=1"], task_name="task")
    ret.status, ret.return_value = status, value
    return ret


def test_the_job_return_comes_back_from_the_child() -> None:
    parent = os.getpid()
    handle = ForkedTaskHandle(
        lambda: job_return(TaskStatus.COMPLETED, {"pid": os.getpid(), "big": "x" * 300_000}), "job-0"
    )
    status = handle.wait(timeout=30)
    assert (status.state, status.exit_code) == (JobState.SUCCEEDED, 0)
    value = handle.job_return.return_value
    assert value["pid"] != parent and len(value["big"]) == 300_000  # larger than a pipe's buffer
    assert handle.id == f"job-0:{value['pid']}"
    assert list(handle.logs(follow=False)) == []


def test_a_task_that_raised_is_a_failed_job_carrying_the_exception() -> None:
    handle = ForkedTaskHandle(lambda: job_return(TaskStatus.FAILED, ValueError("boom")), "job-1")
    status = handle.wait(timeout=30)
    assert (status.state, status.message) == (JobState.FAILED, "the task raised ValueError: boom")
    with pytest.raises(ValueError, match="boom"):
        handle.job_return.return_value  # noqa: B018 -- raises the task's exception, as Hydra does


def test_a_return_value_that_cannot_travel_is_reported() -> None:
    handle = ForkedTaskHandle(lambda: job_return(TaskStatus.COMPLETED, lambda: None), "job-2")
    assert handle.wait(timeout=30).state is JobState.FAILED
    with pytest.raises(TaskError, match="could not be sent to the launcher"):
        handle.job_return.return_value  # noqa: B018 -- raises the send error


def test_a_child_that_dies_is_a_failed_job() -> None:
    handle = ForkedTaskHandle(lambda: os._exit(3), "job-3")
    status = handle.wait(timeout=30)
    assert (status.state, status.exit_code) == (JobState.FAILED, 3)
    assert status.message == "the task's process ended with exit status 3 before returning"


def test_cancel_stops_the_child() -> None:
    handle = ForkedTaskHandle(lambda: time.sleep(60), "job-4")
    assert handle.status().state is JobState.RUNNING
    t0 = time.monotonic()
    handle.cancel()
    assert handle.wait(timeout=30).state is JobState.CANCELLED
    assert time.monotonic() - t0 < 10
