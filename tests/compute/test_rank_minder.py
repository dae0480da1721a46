"""ddlkit.compute.rank_minder with real processes: a minder started as a target's rank entry
starts it (with nothing of the training stack loaded), around a child that prints, fails, is
signalled or leaves processes behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlkit.compute import rank_minder
from ddlkit.testing import alive, wait_for

#: a target's rank entry in miniature: forward signals first, run ``argv[2:]`` as the rank options
#: ``argv[1]`` (JSON) say; of ddlkit only the minder and the stdlib-only modules it needs are loaded
ENTRY = """
import json, sys
from ddlkit.compute import rank_minder as minder
minder.forward_signals()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("ddlkit", "omegaconf", "pluggy", "hydra", "yaml"))
assert loaded == ["ddlkit", "ddlkit._version", "ddlkit.compute", "ddlkit.compute._minder", "ddlkit.compute.layout",
                  "ddlkit.compute.rank_minder", "ddlkit.jobdir"], loaded
sys.exit(minder.run(sys.argv[2:], **json.loads(sys.argv[1])))
"""
LAYOUT = {"DDLKIT_NODE": "1", "DDLKIT_LOCAL_RANK": "0", "DDLKIT_LOCAL_SIZE": "2"}


def minder_command(code: str, *, rank: int, **options: object) -> list[str]:
    options = {"rank": rank, "variables": LAYOUT, "name": "test", **options}
    return [sys.executable, "-c", ENTRY, json.dumps(options), sys.executable, "-c", code]


def run_minder(job_dir: Path, code: str, *, rank: int, **options: object) -> subprocess.CompletedProcess[str]:
    job_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        minder_command(code, rank=rank, **options), cwd=job_dir, capture_output=True, text=True, timeout=60
    )


def start_minder(job_dir: Path, code: str, *, rank: int, **options: object) -> subprocess.Popen[str]:
    job_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        minder_command(code, rank=rank, **options),
        cwd=job_dir,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def record(job_dir: Path, rank: int) -> dict:
    return json.loads((job_dir / ".ranks" / f"rank-{rank}.json").read_text())


def test_rank_0_is_the_console_and_every_rank_has_its_log_and_exit_record(tmp_path: Path) -> None:
    code = (
        "import os, sys; print('progress at node', os.environ['DDLKIT_NODE'], flush=True); "
        "print('a note', file=sys.stderr)"
    )
    done = run_minder(tmp_path, code, rank=0)
    assert done.returncode == 0, done
    assert done.stdout == "progress at node 1\n" and done.stderr == "a note\n"
    assert (tmp_path / "rank-0.log").read_text().splitlines() == ["progress at node 1", "a note"]
    rec = record(tmp_path, 0)
    assert {k: rec[k] for k in ("rank", "node", "local_rank", "code", "log")} == {
        "rank": 0,
        "node": 1,
        "local_rank": 0,
        "code": 0,
        "log": "rank-0.log",
    }
    assert rec["host"] == os.uname().nodename and abs(rec["time"] - time.time()) < 60
    assert not alive(rec["pid"])
    assert not list((tmp_path / ".ranks").glob("*.tmp"))


def test_other_ranks_pass_on_their_error_lines_only(tmp_path: Path) -> None:
    code = """
import sys
print("progress of rank 1", flush=True)
print("a harmless note from rank 1", file=sys.stderr, flush=True)
print("ddlkit: rank 0 has not been heard from for 60 s (last at step 12): stopped or hung?", file=sys.stderr)
raise RuntimeError("rank 1 cannot go on")
"""
    done = run_minder(tmp_path, code, rank=1)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "[rank 1] ddlkit: rank 0 has not been heard from for 60 s (last at step 12): stopped or hung?"
    assert lines[1] == "[rank 1] Traceback (most recent call last):"
    assert "[rank 1] RuntimeError: rank 1 cannot go on" in lines
    assert lines[-1] == "[rank 1] ended with exit status 1"  # its error lines said why: no tail
    assert "progress" not in done.stderr and "harmless" not in done.stderr
    log = (tmp_path / "rank-1.log").read_text()
    assert "progress of rank 1" in log and "a harmless note from rank 1" in log
    assert log.endswith("RuntimeError: rank 1 cannot go on\n[test] rank 1 (node 1) ended with exit status 1\n")
    assert record(tmp_path, 1)["code"] == 1


def test_a_failed_rank_repeats_the_lines_the_console_has_not_shown(tmp_path: Path) -> None:
    code = (
        "import sys; print('Error: a first problem', file=sys.stderr, flush=True); "
        "print('one\\ntwo\\nthree', flush=True); sys.exit(3)"
    )
    done = run_minder(tmp_path / "failed", code, rank=2, tail_lines=2)
    assert done.returncode == 3
    assert done.stderr.splitlines() == [
        "[rank 2] Error: a first problem",
        "[rank 2] ended with exit status 3; last lines of rank-2.log:",
        "[rank 2] two",
        "[rank 2] three",
    ]
    # stopped after a checkpoint is no failure: no tail
    done = run_minder(
        tmp_path / "preempted", "import sys; print('one', flush=True); sys.exit(75)", rank=2, tail_lines=2
    )
    assert (done.returncode, done.stderr) == (75, "[rank 2] ended with exit status 75\n")


def test_a_rank_killed_by_a_signal_says_so_and_exits_as_the_shell_would(tmp_path: Path) -> None:
    done = run_minder(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", rank=1)
    assert done.returncode == 128 + signal.SIGKILL
    assert done.stderr == "[rank 1] ended with signal SIGKILL\n"
    assert record(tmp_path, 1)["code"] == -signal.SIGKILL


STOPPER = """
import signal, sys, time
def stop(signum, frame):
    print("stopping on", signal.Signals(signum).name, flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_stop_signals_reach_the_worker_as_sigterm(sig: signal.Signals, tmp_path: Path) -> None:
    minder = start_minder(tmp_path, STOPPER, rank=0)
    try:
        log = tmp_path / "rank-0.log"
        wait_for(lambda: log.exists() and "ready" in log.read_text(), "the worker to start", process=minder)
        minder.send_signal(sig)
        out, err = minder.communicate(timeout=30)
    finally:
        minder.kill()
    assert minder.returncode == 75, err
    assert "stopping on SIGTERM" in out
    assert record(tmp_path, 0)["code"] == 75


SAVER = """
import signal, sys, time
requests = []
signal.signal(signal.SIGTERM, lambda signum, frame: requests.append(signum) or print("stop request", len(requests),
                                                                                   flush=True))
print("ready", flush=True)
deadline = time.monotonic() + 30
while not requests and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(1.5)  # saving its checkpoint: time for the minder to pass on, wrongly, the requests the test sends now
sys.exit(75)
"""


def test_the_worker_is_asked_to_stop_once(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    minder = start_minder(tmp_path, SAVER, rank=0)
    try:
        wait_for(lambda: log.exists() and "ready" in log.read_text(), "the worker to start", process=minder)
        minder.send_signal(signal.SIGTERM)
        wait_for(lambda: "stop request 1" in log.read_text(), "the stop request", process=minder)
        minder.send_signal(signal.SIGUSR1)  # mpirun aborting the job, say
        minder.send_signal(signal.SIGTERM)
        minder.communicate(timeout=30)
    finally:
        minder.kill()
    assert minder.returncode == 75
    assert "stop request 2" not in log.read_text()


def test_a_rank_that_starts_after_a_cancel_stops_at_once(tmp_path: Path) -> None:
    (tmp_path / ".ddlkit").mkdir()
    (tmp_path / ".ddlkit" / "cancel-requested").write_text("now\n")
    t0 = time.monotonic()
    done = run_minder(tmp_path, STOPPER, rank=0, cancel_file=".ddlkit/cancel-requested")
    assert time.monotonic() - t0 < 20
    # stopped by the SIGTERM it was given at once: maybe before its handler was installed
    assert done.returncode in (75, 128 + signal.SIGTERM), done
    assert record(tmp_path, 0)["code"] in (75, -signal.SIGTERM)


def test_what_the_worker_left_running_is_killed_when_it_ends(tmp_path: Path) -> None:
    # a helper that keeps the worker's output pipes open: the minder must not wait for it
    code = (
        "import subprocess, sys; helper = subprocess.Popen(['sleep', '60']); "
        "open('helper.pid', 'w').write(str(helper.pid)); print('leaving', flush=True)"
    )
    t0 = time.monotonic()
    done = run_minder(tmp_path, code, rank=0)
    assert done.returncode == 0 and done.stdout == "leaving\n"
    assert time.monotonic() - t0 < 10
    helper = int((tmp_path / "helper.pid").read_text())
    wait_for(lambda: not alive(helper), "the helper to be killed", timeout=5)


WORKER = "import os, time; open('worker.pid', 'w').write(str(os.getpid())); time.sleep(60)"


def test_the_worker_dies_with_its_minder(tmp_path: Path) -> None:
    minder = start_minder(tmp_path, WORKER, rank=0)
    try:
        wait_for(
            lambda: (tmp_path / "worker.pid").exists() and (tmp_path / "worker.pid").read_text(),
            "the worker",
            process=minder,
        )
        worker = int((tmp_path / "worker.pid").read_text())
        minder.kill()
        minder.wait(timeout=10)
        wait_for(lambda: not alive(worker), "the worker to die with its minder", timeout=5)
    finally:
        minder.kill()


def test_the_worker_is_ended_when_whatever_started_the_rank_is_gone(tmp_path: Path) -> None:
    # the rank's starter (mpirun, slurmstepd) in miniature: a shell that waits for the minder
    starter = subprocess.Popen(
        ["sh", "-c", '"$@" & wait', "sh", *minder_command(WORKER, rank=0)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (tmp_path / "worker.pid").exists() and (tmp_path / "worker.pid").read_text(),
            "the worker",
            process=starter,
        )
        worker = int((tmp_path / "worker.pid").read_text())
        starter.kill()
        starter.wait(timeout=10)
        wait_for(lambda: not alive(worker), "the worker to be ended", timeout=10)
        # and the minder, which reported it
        wait_for(lambda: (tmp_path / ".ranks" / "rank-0.json").exists(), "the exit record", timeout=10)
    finally:
        starter.kill()
    assert record(tmp_path, 0)["code"] == -signal.SIGKILL


def test_a_layout_without_ddlkits_node_variables_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lack DDLKIT_LOCAL_RANK, DDLKIT_LOCAL_SIZE: every compute target"):
        rank_minder.run(["true"], rank=0, variables={"DDLKIT_NODE": "0"}, name="test", job_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())


def test_the_rank_that_failed_first_is_read_back_from_the_records(tmp_path: Path) -> None:
    """What a target reports for a failed job (ddlkit.compute.rank_exits): the rank whose minder
    recorded a failure first -- not the lowest rank, not the last -- where it ran, its log's last
    lines, how the others ended and which never reported."""
    from ddlkit.compute.rank_exits import first_failure, read_records

    run_minder(tmp_path, "print('all good')", rank=2)
    assert read_records(tmp_path)[0]["code"] == 0 and first_failure(tmp_path, 3) is None
    run_minder(tmp_path, "import sys; print('bad data', file=sys.stderr); sys.exit(1)", rank=1)
    run_minder(tmp_path, "import sys; sys.exit(75)", rank=0)  # stopped after it, as its launcher does
    failure = first_failure(tmp_path, 4)
    assert failure is not None and (failure.rank, failure.code) == (1, 1)
    assert failure.log == tmp_path / "rank-1.log"
    host = os.uname().nodename
    message = failure.message()
    assert message.startswith(
        f"rank 1 (node 1, host {host}) failed first, with exit status 1; last lines of "
        f"{tmp_path / 'rank-1.log'}:\n    bad data\n"
    ), message
    assert message.endswith(
        "\n  then rank 0: exit status 75; rank 2: exit status 0; ranks [3]: killed before they could report"
    ), message
    # a cluster simulated on one machine has nodes, not hosts; a real one's may be named by the target
    assert first_failure(tmp_path, 4, node_names=()).headline() == "rank 1 (node 1) failed first, with exit status 1"
    assert first_failure(tmp_path, 4, node_names=["a", "b"]).where() == "node 1, host b"


@pytest.mark.parametrize(
    ("named_end", "first"),
    [
        ("import sys; print('bad batch', file=sys.stderr); sys.exit(1)", 0),  # its own error: it failed first
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 0),  # killed from outside: it failed first
        ("import sys; sys.exit(75)", 1),  # stopped by its launcher after the other failed: not the cause
    ],
    ids=["own-error", "killed", "stopped-after"],
)
def test_a_rank_named_as_lost_failed_first_whatever_order_the_records_came_in(
    tmp_path: Path, named_end: str, first: int
) -> None:
    """Rank 1 finds rank 0 gone and its minder records EXIT_LOST_PEER before rank 0's does (the slower
    minder on a busy node: seen on the real local Slurm). Rank 1's log names rank 0; when rank 0's
    own record shows its own error or a signal, rank 0 failed first, and the job ends as it did."""
    from ddlkit.compute.rank_exits import first_failure

    run_minder(
        tmp_path,
        "import sys; print('ddlkit worker (rank 1): RankLostError: rank 0 left the job during "
        "`allreduce_mean` (its connection closed)', file=sys.stderr); sys.exit(76)",
        rank=1,
    )
    run_minder(tmp_path, named_end, rank=0)
    assert record(tmp_path, 1)["time"] < record(tmp_path, 0)["time"]
    failure = first_failure(tmp_path, 2)
    assert failure is not None and failure.rank == first, failure.message()
    assert failure.code == record(tmp_path, first)["code"]
