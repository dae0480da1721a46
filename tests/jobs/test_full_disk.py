"""A disk that fills up while a job waits to be restarted (issue 37, item 9): the launcher says so in
one line, with what to do, and the job's last checkpoint is whole. On a real file system that really
fills: a 30 MB tmpfs, mounted for the test (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlkit.checkpoint import latest_checkpoint, verify
from ddlkit.testing import FAKES_MODULE, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs takes root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass


def test_a_disk_full_during_a_restart_is_one_line_and_the_checkpoint_stays_whole(small_disk: Path) -> None:
    job_dir = small_disk / "job"
    out = small_disk.parent / "launcher.out"
    with open(out, "w") as stdout:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddlkit",
                "framework=fake",
                "framework.kill_at_step=5",  # rank 0 is lost at step 5: restarted from its checkpoint at step 4
                "framework.step_delay_s=0.1",
                "trainer.checkpoint_every=2",
                "restart.max_restarts=1",
                "restart.backoff_s=5",
                f"hydra.run.dir={job_dir}",
            ],
            cwd=small_disk.parent,
            env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE, "PYTHONUNBUFFERED": "1"},
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        restarting = lambda: "ddlkit: restart 1/1" in out.read_text()  # noqa: E731
        wait_for(restarting, "the restart's backoff", process=launcher, timeout=120)
        fill(small_disk)  # while the launcher waits to restart the job
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and lines[-1].startswith(f"ddlkit: error: no space left on the disk of {job_dir}")
    assert "free some (df -h " in lines[-1] and "run the same command again" in lines[-1]
    checkpoint = latest_checkpoint(job_dir)
    assert checkpoint is not None and verify(checkpoint) is None  # what the job resumes from is whole
