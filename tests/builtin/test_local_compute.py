"""compute=local: the compute-target contract, plus the child process's log and kill guard."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddlkit import ComputeTarget, JobHandle, JobState
from ddlkit.builtin.local_compute import LocalComputeConfig, LocalTarget
from ddlkit.compute.process import describe_exit
from ddlkit.testing.contracts import ComputeTargetContract


class TestLocalTarget(ComputeTargetContract):
    @pytest.fixture
    def target(self) -> ComputeTarget:
        return LocalTarget(LocalComputeConfig(grace_period_s=5.0))

    def test_output_is_kept_in_the_rank_log(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        handle = self.submit(
            target, handles, tmp_path / "log", "print('to the log'); import sys; print('and stderr', file=sys.stderr)"
        )
        assert handle.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED
        assert (tmp_path / "log" / "rank-0.log").read_text().splitlines() == ["to the log", "and stderr"]
        assert handle.id.isdigit()  # the process id on this machine

    def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(
        self, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        target = LocalTarget(LocalComputeConfig(grace_period_s=0.5))
        handle = self.submit(
            target,
            handles,
            tmp_path / "stubborn",
            """
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ready", flush=True)
            time.sleep(60)
        """,
        )
        next(chunk for chunk in handle.logs() if "ready" in chunk)
        t0 = time.monotonic()
        handle.cancel()
        status = handle.wait(timeout=10)
        assert 0.4 < time.monotonic() - t0 < 10
        assert (status.state, status.exit_code) == (JobState.CANCELLED, -9)
        assert status.message.startswith("rank 0 was cancelled (ended with killed by signal SIGKILL); last lines of ")


@pytest.mark.parametrize(
    ("code", "text"),
    [(0, "exit status 0"), (3, "exit status 3"), (-15, "killed by signal SIGTERM"), (-200, "killed by signal 200")],
)
def test_describe_exit(code: int, text: str) -> None:
    assert describe_exit(code) == text


def test_the_job_gets_the_launcher_environment_and_unbuffered_output(tmp_path: Path, monkeypatch) -> None:
    from ddlkit import JobSpec

    monkeypatch.setenv("DDLKIT_TEST_INHERITED", "from-the-launcher")
    code = "import os, sys; print(os.environ['DDLKIT_TEST_INHERITED'], os.environ['PYTHONUNBUFFERED'])"
    spec = JobSpec(name="env", job_dir=tmp_path, args=("-c", code))
    handle = LocalTarget(LocalComputeConfig()).submit(spec)
    assert "".join(handle.logs()) == "from-the-launcher 1\n"
    assert handle.wait(timeout=30).state is JobState.SUCCEEDED
