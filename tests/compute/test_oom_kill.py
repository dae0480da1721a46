"""A rank the kernel's out-of-memory killer ends is not a lost node (issue 37, item 10): a real job on
compute=local_mpi, 2 ranks (and on compute=local, 1), run inside a cgroup v1 memory group of its own
whose limit is a few hundred MiB above what the job needs; rank 1 then allocates past it and the kernel
kills it (SIGKILL, as a lost node's rank would die). The rank's minder reads the group's ``oom_kill``
counter, its exit record says so, and ``judge`` ends the job for good: non-zero, the out-of-memory
headline, no restart used although ``restart.max_restarts`` allows two. Before, the job was restarted
twice, OOM-killed each time."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlkit import JobState
from ddlkit.compute.outcome import Observation, judge
from ddlkit.compute.restarts import classify
from ddlkit.jobdir import EXIT_OOM_KILLED
from ddlkit.testing.ranks import rank_command

MIB = 1 << 20
#: the whole job (launcher, mpirun, 2 minders, 2 ranks) peaks at about 140 MiB charged to its group here;
#: the limit leaves 500 MiB to spare, and rank 1's allocation (framework.hold_mib) is well past it
LIMIT = 640 * MIB
HOLD_MIB = 1024

JOB = (
    "framework=fake",
    "compute=local_mpi",
    "compute.procs_per_node=2",
    "dist=native",
    "data.image_size=8",
    "data.num_classes=4",
    "data.length=64",
    "data.val_length=16",
    "trainer.batch_size=16",
    "trainer.epochs=1",
    "trainer.log_every=1",
    f"framework.hold_mib={HOLD_MIB}",
    "framework.hold_rank=1",
    "restart.max_restarts=2",
    "restart.backoff_s=0",
)


def _memory_root() -> Path | None:
    """This process's cgroup v1 memory group (where the test's own group goes: the machine's limits on
    this process still bound it), None without a v1 memory controller."""
    mount = Path("/sys/fs/cgroup/memory")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            here = mount / path.lstrip("/")
            return here if (here / "cgroup.procs").is_file() else mount if (mount / "cgroup.procs").is_file() else None
    return None


def _procs(group: Path) -> list[int]:
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _limit(group: Path, limit: int) -> None:
    """At most ``limit`` bytes for the group's processes, and no swap to escape to."""
    (group / "memory.limit_in_bytes").write_text(str(limit))
    if (group / "memory.memsw.limit_in_bytes").exists():
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit))


def _in_group(group: Path, command: list[str]) -> list[str]:
    """``command`` started in ``group`` (what it starts inherits it)."""
    return ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh", *command]


@pytest.fixture
def memory_group() -> Iterator[Path]:
    """A cgroup v1 memory group of the test's own (no limit yet: :func:`_limit`); its processes
    killed and the group removed afterwards, whatever the test did."""
    root = _memory_root()
    if root is None:
        pytest.skip("no cgroup v1 memory controller (/sys/fs/cgroup/memory) to put the job in")
    if os.geteuid() != 0 or not os.access(root, os.W_OK):
        pytest.skip(f"cannot create a memory cgroup under {root}: needs root and a writable cgroup file system")
    group = root / f"ddlkit-test-oom-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a memory cgroup under {root}: {err}")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 30
        while _procs(group) and time.monotonic() < deadline:
            for pid in _procs(group):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def test_the_minder_records_the_oom_killers_verdict_and_judge_ends_the_job_for_good(
    tmp_path: Path, memory_group: Path
) -> None:
    """One rank under the real minder in a 96 MiB group allocates 400 MiB: the kernel kills it, the
    minder's record says so, and the job's end is EXIT_OOM_KILLED, never restarted. A rank SIGKILLed
    from outside in the same group (nothing counted) stays a lost node's: restarted."""
    _limit(memory_group, 96 * MIB)
    grow = "import time; held = b'x' * (400 << 20); time.sleep(60)"
    ran = subprocess.run(_in_group(memory_group, rank_command(1, grow)), cwd=tmp_path, capture_output=True, timeout=60)
    assert ran.returncode == 128 + signal.SIGKILL, ran.stderr
    assert b"ended with signal SIGKILL (the out-of-memory killer: its memory cgroup counted an OOM kill)" in ran.stderr
    record = json.loads((tmp_path / ".ranks" / "rank-1.json").read_text())
    assert (record["code"], record["oom_killed"]) == (-signal.SIGKILL, True), record
    status = judge(Observation(JobState.FAILED, 137), tmp_path, job="job x", world_size=2)
    assert (status.state, status.exit_code) == (JobState.FAILED, EXIT_OOM_KILLED), status.message
    headline = status.message.splitlines()[0]
    assert headline.startswith("rank 1 (node 1, host "), headline
    assert ") was killed by the out-of-memory killer (its memory cgroup counted an OOM kill); give it " in headline
    assert classify(status).restart is False

    lost = tmp_path / "lost"
    lost.mkdir()
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    subprocess.run(_in_group(memory_group, rank_command(1, killed)), cwd=lost, capture_output=True, timeout=60)
    record = json.loads((lost / ".ranks" / "rank-1.json").read_text())
    assert (record["code"], record["oom_killed"]) == (-signal.SIGKILL, False), record
    status = judge(Observation(JobState.FAILED, 137), lost, job="job x", world_size=2)
    assert status.exit_code == -signal.SIGKILL and classify(status).restart, status.message


@pytest.mark.slow
@pytest.mark.plugins
@pytest.mark.extras
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun (compute=local_mpi)")
def test_a_rank_killed_by_the_oom_killer_is_not_restarted(tmp_path: Path, memory_group: Path) -> None:
    said, job_dir = _oom_killed_job(tmp_path, memory_group, JOB)
    record = json.loads((job_dir / ".ranks" / "rank-1.json").read_text())
    assert (record["code"], record.get("oom_killed")) == (-signal.SIGKILL, True), record
    assert "rank 1 (node 0)" in said and "was killed by the out-of-memory killer" in said, said


@pytest.mark.slow
def test_a_local_job_killed_by_the_oom_killer_is_not_restarted(tmp_path: Path, memory_group: Path) -> None:
    """compute=local: the job's minder (the standard library's alone) reads the same counter."""
    local = tuple(o for o in JOB if not o.startswith(("compute", "dist=", "framework.hold_rank")))
    said, job_dir = _oom_killed_job(tmp_path, memory_group, ("compute=local", *local))
    record = json.loads((job_dir / ".ddlkit" / "exit.json").read_text())
    assert (record["code"], record.get("oom_killed")) == (-signal.SIGKILL, True), record
    assert "rank 0 was killed by the out-of-memory killer" in said, said


def _oom_killed_job(tmp_path: Path, memory_group: Path, overrides: tuple[str, ...]) -> tuple[str, Path]:
    """A job of ``overrides`` run in ``memory_group`` (limited): one OOM kill counted, the job ended
    EXIT_OOM_KILLED and not restarted. What it said, and its directory."""
    _limit(memory_group, LIMIT)
    job_dir = tmp_path / "job"
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    command = [sys.executable, "-m", "ddlkit", *overrides, f"hydra.run.dir={job_dir}"]
    done = subprocess.run(
        _in_group(memory_group, command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    said = done.stdout + done.stderr
    oom_kills = (memory_group / "memory.oom_control").read_text()
    assert "oom_kill 1\n" in oom_kills, f"not one OOM kill in the job's group: {oom_kills}\n{said}"
    assert done.returncode == EXIT_OOM_KILLED, said
    assert "restart 1/2" not in said, said
    submission = json.loads((job_dir / ".ddlkit" / "submission.json").read_text())
    assert (submission["state"], submission.get("restarts", [])) == ("failed", []), submission
    return said, job_dir
