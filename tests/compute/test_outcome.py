"""ddlkit.compute.outcome.judge: one rule for how a job ended, from what a scheduler says and the exit
records the real rank minder leaves (ddlkit.testing.ranks); and ddlkit.compute.scheduler.SchedulerJob,
the one handle over a scheduler adapter, driven by a scheduler that runs real processes here."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Literal

import pytest

from ddlkit import JobState
from ddlkit.compute.outcome import Observation, judge
from ddlkit.compute.restarts import classify
from ddlkit.compute.scheduler import Scheduler, SchedulerJob
from ddlkit.jobdir import CANCEL_FILE, EXIT_LOST_PEER, EXIT_OOM_KILLED, EXIT_PREEMPTED
from ddlkit.testing import wait_for
from ddlkit.testing.ranks import LOST_PEER, rank_command, rank_exit

OWN_ERROR = "import sys; print('ValueError: bad batch', file=sys.stderr); sys.exit(1)"
KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
CHECKPOINTED = "import sys; sys.exit(75)"
FINE = "print('done')"


def judged(job_dir: Path, seen: Observation, world_size: int = 2):
    return judge(seen, job_dir, job="Slurm job 7", world_size=world_size, log=job_dir / "slurm.log")


def test_a_job_that_runs_is_what_the_scheduler_says(tmp_path: Path) -> None:
    said = "Slurm: PENDING, reason Resources"
    status = judged(tmp_path, Observation(JobState.PENDING, reason=said))
    assert (status.state, status.exit_code, status.message) == (JobState.PENDING, None, said)


def test_every_rank_fine_and_the_scheduler_content_is_a_success(tmp_path: Path) -> None:
    rank_exit(tmp_path, 0, FINE)
    rank_exit(tmp_path, 1, FINE)
    status = judged(tmp_path, Observation(JobState.SUCCEEDED, 0, ranks_always_report=True))
    assert (status.state, status.exit_code) == (JobState.SUCCEEDED, 0)


def test_a_success_with_a_rank_that_never_reported_failed_where_ranks_always_report(tmp_path: Path) -> None:
    rank_exit(tmp_path, 0, FINE)
    status = judged(tmp_path, Observation(JobState.SUCCEEDED, 0, ranks_always_report=True))
    assert status.state is JobState.FAILED and status.exit_code == 1
    assert "Slurm job 7 ended; 1 of 2 ranks reported an exit; last lines of" in status.message
    # a scheduler whose ranks' records come later (copied back) is believed
    assert judged(tmp_path, Observation(JobState.SUCCEEDED, 0)).state is JobState.SUCCEEDED


def test_the_ranks_records_win_over_the_schedulers_exit_code(tmp_path: Path) -> None:
    """srun reports the status of whichever task it picks: here rank 1's 75 after rank 0's own error.
    The job is judged by rank 0, and the scheduler's reason stays in the message."""
    rank_exit(tmp_path, 0, OWN_ERROR)
    rank_exit(tmp_path, 1, CHECKPOINTED)
    status = judged(tmp_path, Observation(JobState.FAILED, EXIT_PREEMPTED, reason="ended FAILED (NonZeroExitCode)"))
    assert (status.state, status.exit_code) == (JobState.FAILED, 1)
    assert status.message.startswith("Slurm job 7 ended FAILED (NonZeroExitCode); rank 0 (node 0, host "), (
        status.message
    )
    assert "failed first, with exit status 1; last lines of " in status.message
    assert "ValueError: bad batch" in status.message and "then rank 1: exit status 75" in status.message
    assert not classify(status).restart


def test_the_scheduler_says_failed_and_a_rank_killed_first_is_restartable(tmp_path: Path) -> None:
    rank_exit(tmp_path, 1, KILLED)
    rank_exit(tmp_path, 0, LOST_PEER.format(rank=0, peer=1, how="left the job"))
    status = judged(tmp_path, Observation(JobState.FAILED, 1, reason="ended NODE_FAIL"))
    assert status.exit_code == -signal.SIGKILL and "rank 1 (node 1, host" in status.message, status.message
    assert classify(status).restart


def oom_killed(job_dir: Path, rank: int, *, verdict: bool | None) -> None:
    """Rank ``rank`` SIGKILLed under the real minder, its record then holding ``verdict`` as a minder
    writes it after reading its memory cgroup's OOM kill count (True: it rose; None: unreadable).
    A real OOM kill under a memory cgroup's limit: tests/compute/test_oom_kill.py."""
    rank_exit(job_dir, rank, KILLED)
    path = job_dir / ".ranks" / f"rank-{rank}.json"
    record = json.loads(path.read_text())
    assert record["code"] == -signal.SIGKILL and "oom_killed" in record, record  # the minder's own key
    path.write_text(json.dumps({**record, "oom_killed": verdict}))


def test_a_rank_the_oom_killer_ended_is_not_restarted_and_the_headline_names_it(tmp_path: Path) -> None:
    """Rank 1 killed by the kernel's OOM killer, rank 0 finding it gone: the job's own end
    (EXIT_OOM_KILLED, never restarted), the headline naming rank 1 and the OOM killer."""
    oom_killed(tmp_path, 1, verdict=True)
    rank_exit(tmp_path, 0, LOST_PEER.format(rank=0, peer=1, how="left the job"))
    status = judged(tmp_path, Observation(JobState.FAILED, EXIT_LOST_PEER, reason="ended FAILED (NonZeroExitCode)"))
    assert (status.state, status.exit_code) == (JobState.FAILED, EXIT_OOM_KILLED), status.message
    headline = status.message.splitlines()[0]
    assert headline.startswith("Slurm job 7 ended FAILED (NonZeroExitCode); rank 1 (node 1, host "), headline
    assert headline.endswith(
        ") was killed by the out-of-memory killer (its memory cgroup counted an OOM kill); give it more memory or "
        "a smaller batch (trainer.batch_size); last lines of " + str(tmp_path / "rank-1.log") + ":"
    ), headline
    assert "then rank 0: exit status 76" in status.message
    verdict = classify(status)
    assert (verdict.restart, verdict.why) == (False, "the kernel's out-of-memory killer ended a rank, and would again")


def test_a_sigkill_the_oom_killer_did_not_count_or_that_cannot_be_told_is_a_lost_node(tmp_path: Path) -> None:
    """Where the memory cgroup counted no OOM kill, or its count could not be read (null), a SIGKILL is
    what it was before: a lost node's, restarted."""
    for verdict in (False, None):
        job_dir = tmp_path / str(verdict)
        oom_killed(job_dir, 1, verdict=verdict)
        status = judged(job_dir, Observation(JobState.FAILED, 137))
        assert status.exit_code == -signal.SIGKILL and "out-of-memory" not in status.message, status.message
        assert status.message.startswith("rank 1 (node 1, host ") and classify(status).restart


def test_a_rank_that_raises_while_another_reports_a_lost_peer_is_not_restarted(tmp_path: Path) -> None:
    """Rank 1 finds rank 0 gone and records EXIT_LOST_PEER first; rank 0's own error, recorded later,
    is the cause: the job's own, never restarted."""
    rank_exit(tmp_path, 1, LOST_PEER.format(rank=1, peer=0, how="left the job"))
    time.sleep(0.01)
    rank_exit(tmp_path, 0, OWN_ERROR)
    status = judged(tmp_path, Observation(JobState.FAILED, EXIT_LOST_PEER))
    assert (status.exit_code, classify(status).restart) == (1, False), status.message


def test_a_silent_rank_named_by_its_peer_failed_first(tmp_path: Path) -> None:
    """Rank 1 never reported (SIGSTOPped, or killed with its minder); rank 0 names it: the headline
    names rank 1, with what the scheduler saw of it when it saw something."""
    rank_exit(tmp_path, 0, LOST_PEER.format(rank=0, peer=1, how="did not reach"))
    status = judged(tmp_path, Observation(JobState.FAILED, EXIT_LOST_PEER))
    assert status.message.startswith("rank 1 stopped answering first; rank 0 (node 0, host"), status.message
    assert classify(status).restart
    seen = Observation(JobState.FAILED, EXIT_LOST_PEER, rank_signals={1: -signal.SIGKILL})
    assert judged(tmp_path, seen).message.startswith("rank 1 was killed by signal SIGKILL first; rank 0 (")


def test_a_cancel_mark_wins_over_everything(tmp_path: Path) -> None:
    rank_exit(tmp_path, 0, OWN_ERROR)
    (tmp_path / CANCEL_FILE).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / CANCEL_FILE).write_text("now\n")
    status = judged(tmp_path, Observation(JobState.FAILED, 1, reason="ended FAILED"))
    assert status.state is JobState.CANCELLED
    assert status.message.startswith("Slurm job 7 was cancelled (ended FAILED); "), status.message
    assert not classify(status).restart
    # and over a success
    assert judged(tmp_path, Observation(JobState.SUCCEEDED, 0)).state is JobState.CANCELLED


def test_a_notice_stop_is_resumable_and_says_the_ranks_checkpointed(tmp_path: Path) -> None:
    rank_exit(tmp_path, 0, CHECKPOINTED)
    rank_exit(tmp_path, 1, CHECKPOINTED)
    (tmp_path / "slurm.log").write_text("saved checkpoint at step 40\n")
    out_of_time = "ran out of time (time limit 00:05:00)"
    seen = Observation(JobState.FAILED, EXIT_PREEMPTED, reason=out_of_time, unless_saved="without a checkpoint")
    status = judged(tmp_path, seen)
    assert (status.exit_code, classify(status).restart) == (EXIT_PREEMPTED, True)
    assert status.message.startswith(
        f"Slurm job 7 {out_of_time}; the ranks checkpointed and stopped (exit 75); last lines of "
    ), status.message
    assert "saved checkpoint at step 40" in status.message


def test_an_end_without_a_checkpoint_says_what_to_change(tmp_path: Path) -> None:
    advice = "without a checkpoint: raise compute.time"
    seen = Observation(JobState.FAILED, -signal.SIGKILL, reason="ran out of time", unless_saved=advice)
    status = judged(tmp_path, seen)
    assert status.message.startswith(
        f"Slurm job 7 ran out of time {advice}; the ranks ended with killed by signal SIGKILL; last lines of "
    ), status.message


def test_no_record_at_all_leaves_the_schedulers_code(tmp_path: Path) -> None:
    seen = Observation(JobState.FAILED, 137, reason="failed: OutOfMemory")
    status = judge(seen, tmp_path, job="job x", world_size=2, tail=["oom"])
    assert (status.state, status.exit_code) == (JobState.FAILED, 137)
    said = "job x failed: OutOfMemory; the ranks ended with exit status 137; last lines of its log:\n    oom"
    assert status.message == said, status.message


def test_a_job_that_never_started_is_its_reason_alone(tmp_path: Path) -> None:
    """A job the target removed from the queue (it could never start): no rank ran, no log to quote;
    the message is one line, the exit code the scheduler's (a config error's)."""
    why = "can never start (PartitionConfig): lower compute.nodes; it was cancelled"
    status = judged(tmp_path, Observation(JobState.FAILED, 2, reason=why, started=False))
    assert (status.state, status.exit_code, status.message) == (JobState.FAILED, 2, f"Slurm job 7 {why}")
    (tmp_path / CANCEL_FILE).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / CANCEL_FILE).write_text("now\n")  # cancelled while it waited
    status = judged(tmp_path, Observation(JobState.FAILED, 2, reason=why, started=False))
    assert (status.state, status.message) == (JobState.CANCELLED, f"Slurm job 7 was cancelled ({why})")
    # a job whose ranks ran after all is judged by them
    rank_exit(tmp_path, 0, OWN_ERROR)
    status = judged(tmp_path, Observation(JobState.FAILED, 2, reason=why, started=False))
    assert status.exit_code == 1 and "ValueError: bad batch" in status.message


# ---------------------------------------------------------------------------- the one handle
class ProcessScheduler(Scheduler):
    """A scheduler in miniature: each job is a process here running ``python -c CODE`` as rank 0
    under the real rank minder, its output in ``out.log``. What it says is only what it sees."""

    noun = "process job"

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.described = 0
        self.signals: list[str] = []

    def submit(self, code: str) -> str:
        with open(self.job_dir / "out.log", "ab") as log:
            proc = subprocess.Popen(rank_command(0, code), cwd=self.job_dir, stdout=log, stderr=subprocess.STDOUT)
        self.procs[str(proc.pid)] = proc
        return str(proc.pid)

    def describe(self, job_id: str) -> Observation:
        self.described += 1
        code = self.procs[job_id].poll()
        if code is None:
            return Observation(JobState.RUNNING, reason=f"process {job_id}")
        return Observation(JobState.SUCCEEDED if code == 0 else JobState.FAILED, code)

    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        self.signals.append(how)
        self.procs[job_id].send_signal(signal.SIGTERM if how == "stop" else signal.SIGKILL)

    def read_log(self, job_id: str, offset: int) -> str:
        return (self.job_dir / "out.log").read_text()[offset:]


def scheduled(tmp_path: Path, code: str, **options: float) -> tuple[ProcessScheduler, SchedulerJob]:
    scheduler = ProcessScheduler(tmp_path)
    job = SchedulerJob(
        scheduler,
        scheduler.submit(code),
        job_dir=tmp_path,
        world_size=1,
        poll_interval_s=options.get("poll_interval_s", 0.05),
        grace_period_s=options.get("grace_period_s", 5),
        log=tmp_path / "out.log",
    )
    return scheduler, job


def test_the_handle_streams_judges_and_keeps_the_final_status(tmp_path: Path) -> None:
    code = "import time\nfor i in range(3): print('step', i, flush=True); time.sleep(0.1)"
    scheduler, job = scheduled(tmp_path, code)
    text = "".join(job.logs(follow=True))
    assert all(f"step {i}" in text for i in range(3)), text
    status = job.wait(timeout=30)
    assert status.state is JobState.SUCCEEDED
    asked = scheduler.described
    assert job.status() is status and scheduler.described == asked  # kept: the scheduler is not asked again


def test_the_handle_asks_the_scheduler_at_its_pace(tmp_path: Path) -> None:
    scheduler, job = scheduled(tmp_path, "import time; time.sleep(3)", poll_interval_s=1.0)
    for _ in range(50):
        assert job.status().state is JobState.RUNNING
    assert scheduler.described == 1
    job.cancel()
    job.wait(timeout=30)


def test_a_rank_that_fails_is_judged_by_its_record(tmp_path: Path) -> None:
    _, job = scheduled(tmp_path, OWN_ERROR)
    status = job.wait(timeout=30)
    assert (status.state, status.exit_code) == (JobState.FAILED, 1)
    assert status.message.startswith("rank 0 (node 0, host "), status.message


def test_cancel_marks_stops_and_kills_after_the_grace_period(tmp_path: Path) -> None:
    """A rank that ignores the stop is killed once the grace period is over; the job is CANCELLED
    (the mark), not a failure the restart policy would restart."""
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    scheduler, job = scheduled(tmp_path, code, grace_period_s=0.5)
    wait_for(lambda: "up" in (tmp_path / "out.log").read_text(), "the job to start", timeout=30)
    job.cancel()
    job.cancel()  # idempotent
    assert (tmp_path / CANCEL_FILE).is_file()
    status = job.wait(timeout=30)
    assert status.state is JobState.CANCELLED, status
    assert scheduler.signals == ["stop", "kill"]
    assert not any(p.poll() is None for p in scheduler.procs.values())


def test_a_handle_from_another_process_sees_the_same_end(tmp_path: Path) -> None:
    """What `ddlkit jobs status` does: a new handle on an ended job judges it alike."""
    _, job = scheduled(tmp_path, KILLED)
    first = job.wait(timeout=30)
    again = SchedulerJob(job.scheduler, job.id, job_dir=tmp_path, world_size=1, poll_interval_s=1, grace_period_s=1)
    assert again.status() == first and first.exit_code == -signal.SIGKILL
    assert first.message.startswith("rank 0 (node 0, host "), first.message


@pytest.mark.parametrize("fetched", [True, False])
def test_files_are_fetched_before_the_job_is_judged(tmp_path: Path, fetched: bool) -> None:
    """A target that copies the job directory to its nodes brings the ranks' records back with the
    files: judged after the fetch; a fetch that fails leaves the scheduler's word, and collect() says why."""
    elsewhere = tmp_path / "node"
    rank_exit(elsewhere, 0, OWN_ERROR)

    class Remote(ProcessScheduler):
        def describe(self, job_id: str) -> Observation:
            return Observation(JobState.FAILED, 9, reason="failed")

        def fetch(self, job_id: str, job_dir: Path) -> None:
            if not fetched:
                raise ConnectionError("the storage account did not answer")
            import shutil

            shutil.copytree(elsewhere, job_dir, dirs_exist_ok=True)

    here = tmp_path / "here"
    here.mkdir()
    job = SchedulerJob(Remote(here), "1", job_dir=here, world_size=1, poll_interval_s=1, grace_period_s=1)
    status = job.status()
    if fetched:
        assert status.exit_code == 1 and "ValueError: bad batch" in status.message
    else:
        assert status.exit_code == 9
        with pytest.raises(ConnectionError):
            job.collect()
