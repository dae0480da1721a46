"""compute=slurm on a real Slurm cluster (see conftest.py): the compute contract, training runs,
pending and running, cancel with checkpoint, a warning signal that makes the job checkpoint,
re-queue and resume, a sweep, ``ddlkit plan``, ``ddlkit jobs``, and the one-line errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ddlkit
from ddlkit import JobSpec, JobState
from ddlkit.testing import FAKES_MODULE, RunFactory, hold, interruptible, wait_for
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit.testing.core import latest_checkpoint, verify
from ddlkit_slurm.rank import layout, tasks_per_node
from ddlkit_slurm.target import EXIT_RECORD, SCRIPT, SlurmConfig, SlurmTarget

#: a job that lasts: the fake framework sleeps this long per step (80 steps by default)
SLOW = ("framework.step_delay_s=0.25",)
#: seconds between two looks at a job's state: each runs scontrol
SLURM_PACE = 0.2


def slurm_target(**options: object) -> SlurmTarget:
    return SlurmTarget(SlurmConfig(**{"poll_interval_s": 0.5, "grace_period_s": 20.0, **options}))


def scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


def settled_state(job_id: str) -> str:
    """The job's final state in Slurm. Our handle may decide the job's end from the ranks' own exit records
    while slurmctld still says COMPLETING (the epilog and the last processes ending): wait that out."""
    transitional = {"COMPLETING", "CONFIGURING", "RUNNING", "SIGNALING", "STAGE_OUT"}
    settled = lambda: scontrol(job_id)["JobState"] not in transitional  # noqa: E731
    wait_for(settled, f"Slurm to settle job {job_id}", timeout=60, pace=SLURM_PACE)
    return scontrol(job_id)["JobState"]


def submission(job_dir: Path) -> dict:
    return json.loads((job_dir / ".ddlkit" / "submission.json").read_text())


# ---------------------------------------------------------------------------- no cluster needed
def test_tasks_per_node_and_rank_layout() -> None:
    assert tasks_per_node("4(x2),2") == [4, 4, 2]
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "10",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2),2",
    }
    assert layout(env) == {
        "RANK": "5",
        "WORLD_SIZE": "10",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "DDLKIT_NODE": "1",
        "DDLKIT_LOCAL_RANK": "1",
        "DDLKIT_LOCAL_SIZE": "4",
    }
    dist = ddlkit.DistContext.from_env("native", layout(env))
    assert (dist.rank, dist.world_size, dist.local_rank, dist.local_size, dist.node) == (5, 10, 1, 4, 1)


def test_batch_script_has_the_options_and_no_secret(tmp_path: Path) -> None:
    target = slurm_target(
        nodes=2,
        procs_per_node=4,
        partition="gpu",
        time="04:00:00",
        gpus_per_node=4,
        cpus_per_task=8,
        mem="64G",
        account="proj",
        qos="high",
        constraint="a100",
        extra_sbatch=["--exclusive", "#SBATCH --reservation=demo"],
        python="/opt/py/bin/python",
        signal_before_s=300,
        max_requeues=2,
    )
    spec = JobSpec(
        name="job-1",
        job_dir=tmp_path / "never",
        env={"DDLKIT_PLUGINS": "x"},
        secret_env={"DDLKIT_SECRET_KEY": "hunter2"},
    )
    text = target.plan(spec)
    for line in (
        "--nodes=2",
        "--ntasks-per-node=4",
        "--partition=gpu",
        "--time=04:00:00",
        "--gpus-per-node=4",
        "--cpus-per-task=8",
        "--mem=64G",
        "--account=proj",
        "--qos=high",
        "--constraint=a100",
        "--exclusive",
        "--reservation=demo",
        "--signal=B:USR1@300",
        "--requeue",
        "--job-name=job-1",
    ):
        assert f"#SBATCH {line}\n" in text, line
    assert (
        "srun --kill-on-bad-exit=1 --ntasks=8 /opt/py/bin/python -m ddlkit_slurm.rank -- /opt/py/bin/python "
        "-m ddlkit.rank.worker job.json" in text
    )
    assert "max_requeues=2" in text and "DDLKIT_SECRET_KEY" in text and "hunter2" not in text
    assert target.world_size == 8
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"time": "four hours"}, "compute.time=four hours is not a Slurm time limit"),
        ({"nodes": 0}, "compute.nodes=0 is invalid"),
        ({"launcher": "pdsh"}, "compute.launcher=pdsh is not supported"),
        ({"extra_sbatch": ["exclusive"]}, "is not a batch option"),
        ({"poll_interval_s": 0}, "compute.poll_interval_s=0 is invalid"),
    ],
)
def test_bad_options_are_config_errors(options: dict, fragment: str) -> None:
    with pytest.raises(ddlkit.ConfigError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        slurm_target(**options)


def test_no_sbatch_on_path_says_it_needs_a_login_node(run_factory: RunFactory, tmp_path: Path) -> None:
    outcome = run_factory("compute=slurm", env={"PATH": str(tmp_path / "empty-bin")})
    outcome.assert_one_line_error("needs Slurm's `sbatch` on PATH", "login node")


@pytest.mark.skipif(
    shutil.which("sinfo") is None or Path("/etc/slurm/slurm.conf").exists(),
    reason="needs Slurm's commands and no cluster configured in /etc/slurm",
)
def test_no_slurm_conf_says_how_to_give_one(run_factory: RunFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    line = run_factory("compute=slurm").assert_one_line_error(
        "sinfo finds no Slurm configuration: export SLURM_CONF=", "scripts/local_slurm.sh start"
    )
    assert "DNS" not in line


def test_plan_prints_the_batch_script(run_factory: RunFactory) -> None:
    outcome = run_factory.cli(
        "plan",
        "framework=fake",
        "compute=slurm",
        "compute.partition=batch",
        "compute.time=10:00",
        "compute.procs_per_node=2",
        "dist=native",
    )
    outcome.assert_success()
    assert "#!/bin/bash" in outcome.stdout
    assert "#SBATCH --partition=batch" in outcome.stdout and "#SBATCH --time=10:00" in outcome.stdout
    assert "#SBATCH --ntasks-per-node=2" in outcome.stdout and "sbatch --parsable" in outcome.stdout
    assert "srun" in outcome.stdout and "ddlkit.rank.worker job.json" in outcome.stdout


@pytest.mark.slow
def test_sharded_training_writes_whole_checkpoints_that_resume_on_fewer_ranks(
    slurm_cluster: str, run_factory: RunFactory
) -> None:
    """dist=fsdp under srun: both ranks write their shards into the job directory on the shared
    disk, and the checkpoint of 2 ranks resumes in a job of 1."""
    pytest.importorskip("ddlkit_pytorch")
    train = (
        "framework=pytorch",
        "model=resnet18",
        "data.image_size=16",
        "data.num_classes=10",
        "trainer.validate=false",
        "trainer.checkpoint_every=2",
        "dist=fsdp",
        "compute=slurm",
        "compute.poll_interval_s=0.5",
    )
    first = run_factory(*train, "compute.procs_per_node=2", "trainer.batch_size=4", "trainer.max_steps=4", timeout=300)
    first.assert_success()
    checkpoint = latest_checkpoint(first.job_dir)
    assert verify(checkpoint) is None and {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in checkpoint.iterdir()}
    resumed = run_factory(
        *train, "trainer.batch_size=8", "trainer.max_steps=6", job_dir=first.job_dir, timeout=300
    ).assert_success()
    assert (resumed.result["world_size"], resumed.result["resumed_from_step"], resumed.result["steps"]) == (1, 4, 6)


# ---------------------------------------------------------------------------- the contract
@pytest.mark.slow
class TestSlurmContract(ComputeTargetContract):
    # a real queue: seconds to schedule, srun to start the step
    timeout_s = 120.0
    cancel_timeout_s = 60.0

    @pytest.fixture
    def target(self, slurm_cluster: str) -> SlurmTarget:
        return slurm_target(grace_period_s=10.0)

    @pytest.fixture
    def multi_rank_target(self, slurm_cluster: str) -> SlurmTarget:
        return slurm_target(grace_period_s=10.0, procs_per_node=2)


# ---------------------------------------------------------------------------- bad input, on the cluster
def test_unknown_partition_lists_the_partitions(slurm_cluster: str, run_factory: RunFactory) -> None:
    run_factory("compute=slurm", "compute.partition=nope").assert_one_line_error(
        "compute.partition=nope is not a partition", "debug"
    )


def test_more_nodes_than_the_partition_has(slurm_cluster: str, run_factory: RunFactory) -> None:
    run_factory("compute=slurm", "compute.partition=debug", "compute.nodes=5", "dist=native").assert_one_line_error(
        "compute.nodes=5 asks for more nodes than partition debug has (1)"
    )


def test_more_nodes_than_the_default_partition_has(slurm_cluster: str, run_factory: RunFactory) -> None:
    """Without compute.partition the job goes to the cluster's default partition: checked as well
    (the job was queued, and stayed PENDING for ever, in silence)."""
    run_factory("compute=slurm", "compute.nodes=2", "dist=native", timeout=60).assert_one_line_error(
        "compute.nodes=2 asks for more nodes than partition debug has (1), the cluster's default: lower compute.nodes."
    )


@pytest.mark.parametrize(
    "sbatch_args, reason, fix",
    [
        # Slurm says PartitionConfig first, the precise reason once its scheduler has looked
        (["--nodes=2"], "PartitionNodeLimit|PartitionConfig", "lower compute.nodes"),
        (["--partition=batch", "--time=2-00:00:00"], "PartitionTimeLimit|PartitionConfig", "compute.time"),
        (["--ntasks-per-node=999"], "PartitionConfig", "compute.procs_per_node"),
    ],
)
def test_a_job_that_can_never_start_fails_naming_the_fix(
    slurm_cluster: str, tmp_path: Path, sbatch_args: list[str], reason: str, fix: str
) -> None:
    """A job the cluster keeps queued that can never run (the check before sbatch cannot know every
    limit) ends, cancelled, with the fix: exit status 2, as a config error."""
    job_id = subprocess.run(
        ["sbatch", "--parsable", *sbatch_args, f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    handle = slurm_target().attach(job_id, job_dir=tmp_path)
    status = handle.wait(timeout=30)
    assert status.state is JobState.FAILED and status.exit_code == 2, status
    assert re.match(rf"Slurm job {job_id} can never start \(({reason})\): ", status.message), status.message
    assert fix in status.message and "\n" not in status.message
    wait_for(
        lambda: scontrol(job_id)["JobState"] == "CANCELLED", "Slurm to cancel the job", timeout=10, pace=SLURM_PACE
    )


def test_bad_time_format_is_rejected(slurm_cluster: str, run_factory: RunFactory) -> None:
    run_factory("compute=slurm", "compute.time=4h").assert_one_line_error("compute.time=4h is not a Slurm time limit")


def test_sbatch_failure_shows_slurms_message(slurm_cluster: str, run_factory: RunFactory) -> None:
    refused = run_factory("compute=slurm", "compute.extra_sbatch=['--reservation=no-such-reservation']")
    line = refused.assert_one_line_error("sbatch refused the job")
    assert "reservation" in line.lower()


# ---------------------------------------------------------------------------- real training jobs
@pytest.mark.slow
def test_training_run_on_slurm(slurm_cluster: str, run_factory: RunFactory) -> None:
    outcome = run_factory("compute=slurm", "compute.poll_interval_s=0.5").assert_success()
    assert outcome.result["status"] == "completed" and outcome.result["world_size"] == 1
    job_dir = outcome.job_dir
    assert "train epoch" in outcome.stdout  # rank 0's output streamed through the batch job's output
    job_id = submission(job_dir)["id"]
    assert json.loads((job_dir / EXIT_RECORD).read_text())["job_id"] == job_id
    assert settled_state(job_id) == "COMPLETED"
    assert (job_dir / SCRIPT).read_text().startswith("#!/bin/bash")


@pytest.mark.slow
def test_secrets_reach_the_ranks_and_never_slurms_spool(slurm_cluster: str, run_factory: RunFactory) -> None:
    """sbatch's environment held the job's secrets, and Slurm keeps it in its spool
    (StateSaveLocation) (issue 37, item 4): now they travel in a file of the job directory that
    is the user's alone, which the batch script removes when the job is over."""
    import hashlib
    import secrets

    marker = f"LEAKslurm{secrets.token_hex(8)}"  # this run's alone: the cluster keeps other jobs' records
    token = f"sv=2026-01-01&se=2030-01-01&sp=r&sig={marker}"
    expected = hashlib.sha256(f"{token}|".encode()).hexdigest()
    outcome = run_factory(
        "compute=slurm",
        "compute.procs_per_node=2",
        "dist=native",
        "compute.poll_interval_s=0.5",
        "storage=memory",
        f"storage.sas_token='{token}'",
        f"storage.expect_sha256={expected}",
        timeout=240,
    )
    outcome.assert_success()  # both ranks got them back: the storage checks their digest on each
    slurm_dir = Path(slurm_cluster).resolve().parent  # the cluster's config, state, spool and logs
    places = [slurm_dir, outcome.job_dir]
    leaks = [
        str(p)
        for place in places
        for p in place.rglob("*")
        if p.is_file() and not p.is_symlink() and marker.encode() in p.read_bytes()
    ]
    assert leaks == []
    assert not (outcome.job_dir / ".ddlkit" / "secrets.json").exists()


@pytest.mark.slow
def test_multi_rank_job_with_native_dist(slurm_cluster: str, run_factory: RunFactory) -> None:
    outcome = run_factory(
        "compute=slurm", "compute.procs_per_node=3", "dist=native", "compute.poll_interval_s=0.5"
    ).assert_success()
    assert outcome.result["world_size"] == 3
    for rank in range(3):
        assert (outcome.job_dir / f"rank-{rank}.log").is_file()
    assert scontrol(submission(outcome.job_dir)["id"])["NumTasks"] == "3"


@pytest.mark.slow
def test_pending_then_running(slurm_cluster: str, tmp_path: Path) -> None:
    """A job that waits for a full node is PENDING, then RUNNING once the node frees up."""
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True).stdout.split()[0]
    blocker = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--ntasks={cpus}",
            f"--chdir={tmp_path}",
            "--output=/dev/null",
            "--wrap",
            "sleep 120",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    blocker_id = blocker.stdout.strip()
    try:
        wait_for(
            lambda: scontrol(blocker_id)["JobState"] == "RUNNING", "the blocker to run", timeout=60, pace=SLURM_PACE
        )
        target = slurm_target()
        job_dir = tmp_path / "waits"
        job_dir.mkdir()
        (job_dir / "job.json").write_text("{}")
        handle = target.submit(
            JobSpec(
                name="waits", job_dir=job_dir, args=("-c", "import time; print('running', flush=True); time.sleep(3)")
            )
        )
        assert handle.status().state is JobState.PENDING
        waiting = wait_for(
            lambda: (s := handle.status()).state is JobState.PENDING and "Resources" in s.message and s,
            "Slurm to say the job waits for resources",
            timeout=30,
            pace=SLURM_PACE,
        )
        assert "PENDING" in waiting.message
        hold(
            1.0,
            "the job stays pending while the node is taken, also when the handle next asks Slurm "
            "(compute.poll_interval_s=0.5)",
        )
        assert handle.status().state is JobState.PENDING
    finally:
        subprocess.run(["scancel", blocker_id], check=True)
    wait_for(lambda: handle.status().state is JobState.RUNNING, "the job to run", timeout=60, pace=SLURM_PACE)
    status = handle.wait(timeout=60)
    assert status.state is JobState.SUCCEEDED, status
    assert "running" in "".join(handle.logs(follow=False))


@pytest.mark.slow
def test_a_pending_job_says_so_and_why(slurm_cluster: str, run_factory: RunFactory, tmp_path: Path) -> None:
    """While a job waits in the queue, the launcher prints its state and Slurm's reason: it is not silent."""
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True).stdout.split()[0]
    blocker_id = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--ntasks={cpus}",
            f"--chdir={tmp_path}",
            "--output=/dev/null",
            "--wrap",
            "sleep 120",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        wait_for(
            lambda: scontrol(blocker_id)["JobState"] == "RUNNING", "the blocker to run", timeout=60, pace=SLURM_PACE
        )
        env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddlkit",
                "framework=fake",
                "compute=slurm",
                "compute.poll_interval_s=0.5",
                f"hydra.run.dir={tmp_path / 'job'}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = iter(launcher.stdout.readline, "")
            assert next(lines).startswith("ddlkit: job ")
            assert next(lines) == "ddlkit: job pending (Slurm: PENDING, reason Resources), no output yet\n"
            # a job cancelled before it started has nothing to resume
            run_factory("--detach", "compute=slurm", job_dir=tmp_path / "never").assert_success()
            cancel = run_factory.cli("jobs", "cancel", str(tmp_path / "never")).assert_success()
            assert cancel.stdout.endswith("; it left no checkpoint: nothing to resume\n"), cancel.output
            assert "resume with" not in cancel.output
        finally:
            subprocess.run(["scancel", blocker_id], check=True)
        stdout, stderr = launcher.communicate(timeout=120)
    finally:
        subprocess.run(["scancel", blocker_id], check=True)
    assert launcher.returncode == 0, stderr
    assert "ddlkit: done; result in" in stdout


@pytest.mark.slow
def test_jobs_cancel_checkpoints_and_jobs_status_logs(
    slurm_cluster: str, run_factory: RunFactory, tmp_path: Path
) -> None:
    job_dir = tmp_path / "cancelled"
    run_factory.cli(
        "--detach", "framework=fake", "compute=slurm", "compute.poll_interval_s=0.5", *SLOW, f"hydra.run.dir={job_dir}"
    ).assert_success()
    job_id = submission(job_dir)["id"]
    log = job_dir / "slurm.log"
    wait_for(lambda: log.exists() and "step 10/" in log.read_text(), "the job to train", timeout=90)
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success()
    assert "running" in status.stdout.lower(), status.output
    logs = run_factory.cli("jobs", "logs", str(job_dir)).assert_success()
    assert "train epoch" in logs.stdout
    cancel = run_factory.cli("jobs", "cancel", str(job_dir), timeout=120)
    assert cancel.returncode in (0, 75), cancel.output
    record = json.loads((job_dir / EXIT_RECORD).read_text())
    assert record["job_id"] == job_id and record["code"] == 75  # the worker checkpointed, then stopped
    assert any((job_dir / "checkpoints").iterdir())
    after = run_factory.cli("jobs", "status", str(job_dir))
    assert "cancelled" in after.stdout.lower(), after.output
    handle = slurm_target(poll_interval_s=1, grace_period_s=1).attach(job_id, job_dir=job_dir)
    assert handle.status().state is JobState.CANCELLED


@pytest.mark.slow
def test_warning_signal_checkpoints_requeues_and_resumes(
    slurm_cluster: str, run_factory: RunFactory, tmp_path: Path
) -> None:
    """What Slurm sends before the time limit (--signal=B:USR1@...): the job checkpoints, re-queues
    itself and resumes from its checkpoint in the same job directory."""
    job_dir = tmp_path / "preempted"
    run_factory.cli(
        "--detach", "framework=fake", "compute=slurm", "compute.poll_interval_s=0.5", *SLOW, f"hydra.run.dir={job_dir}"
    ).assert_success()
    job_id = submission(job_dir)["id"]
    log = job_dir / "slurm.log"
    wait_for(lambda: log.exists() and "step 10/" in log.read_text(), "the job to train", timeout=90)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    wait_for(lambda: "re-queueing" in log.read_text(), "the job to re-queue itself", timeout=60)
    handle = slurm_target(grace_period_s=10).attach(job_id, job_dir=job_dir)
    status = handle.wait(timeout=180)
    assert status.state is JobState.SUCCEEDED, status
    result = json.loads((job_dir / "result.json").read_text())
    assert result["status"] == "completed"
    assert result["resumed_from_step"] > 0
    assert scontrol(job_id)["Restarts"] == "1"
    assert "(run 2)" in log.read_text()


@pytest.mark.slow
def test_max_requeues_zero_stops_with_a_checkpoint(slurm_cluster: str, run_factory: RunFactory, tmp_path: Path) -> None:
    job_dir = tmp_path / "no-requeue"
    run_factory.cli(
        "--detach",
        "framework=fake",
        "compute=slurm",
        "compute.poll_interval_s=0.5",
        "compute.max_requeues=0",
        *SLOW,
        f"hydra.run.dir={job_dir}",
    ).assert_success()
    job_id = submission(job_dir)["id"]
    log = job_dir / "slurm.log"
    wait_for(lambda: log.exists() and "step 10/" in log.read_text(), "the job to train", timeout=90)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    status = slurm_target(grace_period_s=10).attach(job_id, job_dir=job_dir).wait(timeout=90)
    assert (status.state, status.exit_code) == (JobState.FAILED, 75), status
    assert "compute.max_requeues" in status.message
    assert scontrol(job_id)["Restarts"] == "0"


@pytest.mark.slow
def test_a_time_limit_is_said_whether_or_not_the_ranks_end_before_the_batch_shell_hears_it(
    slurm_cluster: str, tmp_path: Path
) -> None:
    """Two jobs at once, each with Slurm's shortest time limit (1 minute: they share the wait).

    Without a warning signal (signal_before_s=0), Slurm ends the job at its time limit: the job ran
    out of time without a checkpoint, and what to change is named.

    At the time limit Slurm signals the ranks' step and the batch shell; when srun ends first, the
    script writes its exit record (srun's status, 143) before its own SIGTERM arrives, as it does after
    any failure. A batch script that does just that: the job still ran out of time, and says so."""
    job_dir = tmp_path / "timeout"
    job_dir.mkdir()
    (job_dir / "job.json").write_text("{}")
    limited = slurm_target(time="1", signal_before_s=0).submit(
        JobSpec(name="timeout", job_dir=job_dir, args=("-c", "import time; time.sleep(600)"))
    )

    ends_first = tmp_path / "ends-first"
    ends_first.mkdir()
    script = ends_first / "ends-first.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"mkdir -p {Path(EXIT_RECORD).parent}\n"
        f'ended() {{ printf \'{{"job_id": "%s", "code": 143}}\' "$SLURM_JOB_ID" > {EXIT_RECORD}; exit 143; }}\n'
        "trap ended TERM\n"
        "sleep 600 &\n"
        "wait\n"
    )
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--time=1", f"--chdir={ends_first}", "--output=slurm.log", str(script)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    status = limited.wait(timeout=200)
    assert status.state is JobState.FAILED, status
    assert "ran out of time" in status.message and "without saving a checkpoint" in status.message, status.message
    assert "compute.signal_before_s" in status.message
    assert settled_state(limited.id) == "TIMEOUT"

    handle = slurm_target().attach(job_id, job_dir=ends_first)
    wait_for(lambda: (ends_first / EXIT_RECORD).exists(), "the time limit", timeout=60, pace=SLURM_PACE)
    status = handle.wait(timeout=60)
    assert (status.state, status.exit_code) == (JobState.FAILED, 143), status
    assert status.message.startswith(f"Slurm job {job_id} ran out of time (time limit 00:01:00) without saving"), (
        status.message
    )


@pytest.mark.slow
def test_sweep_of_two_jobs_with_early_stopping(slurm_cluster: str, run_factory: RunFactory, tmp_path: Path) -> None:
    """A sweep on Slurm, one Slurm job per run; with sweep.early_stopping=asha (rungs at 1 of 2 epochs,
    the better half goes on) the better trial's second segment is a Slurm job of its own that resumes
    the first one's checkpoint."""
    sweep_dir = tmp_path / "sweep"
    outcome = run_factory.cli(
        "-m",
        "framework=fake",
        "compute=slurm",
        "compute.poll_interval_s=0.5",
        "optimizer.lr=0.1,0.05",
        "sweep.early_stopping.scheduler=asha",
        "sweep.early_stopping.reduction_factor=2",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=240,
    )
    outcome.assert_success()
    entries = list(json.loads((sweep_dir / "ledger.json").read_text())["jobs"].values())
    assert sorted(e["status"] for e in entries) == ["completed", "paused"], entries
    best = next(e for e in entries if e["status"] == "completed")
    assert [(s["from"], s["to"]) for s in best["segments"]] == [(0, 1), (1, 2)]
    result = json.loads((Path(best["job_dir"]) / "result.json").read_text())
    assert result["resumed_from_step"] == result["steps"] // 2 > 0  # from the checkpoint at 1 epoch
    assert submission(Path(best["job_dir"]))["restarts"] == []  # a segment is a submission of its own, not a restart
    ids = {str(e["handle"]) for e in entries}
    assert len(ids) == 2 and all(i.isdigit() for i in ids)  # one Slurm job each (the last run's)
    for i in ids:
        assert settled_state(i) == "COMPLETED"
    assert (sweep_dir / "report.md").is_file()


@pytest.mark.slow
def test_ctrl_c_cancels_the_job_which_checkpoints(slurm_cluster: str, tmp_path: Path) -> None:
    job_dir = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            "compute=slurm",
            "compute.poll_interval_s=0.5",
            *SLOW,
            f"hydra.run.dir={job_dir}",
        ],
        env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=interruptible,
    )
    try:
        log = job_dir / "slurm.log"
        wait_for(lambda: log.exists() and "step 10/" in log.read_text(), "the job to train", timeout=90, process=proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out
    assert "asking the job to checkpoint and stop" in out and "resume" in out
    record = json.loads((job_dir / EXIT_RECORD).read_text())
    assert record["code"] == 75
    assert submission(job_dir)["state"] == "cancelled"


@pytest.mark.slow
def test_jobs_attach_follows_a_detached_job_to_its_end(
    slurm_cluster: str, run_factory: RunFactory, tmp_path: Path
) -> None:
    job_dir = tmp_path / "attached"
    run_factory.cli(
        "--detach",
        "framework=fake",
        "compute=slurm",
        "compute.poll_interval_s=0.5",
        "framework.step_delay_s=0.02",
        f"hydra.run.dir={job_dir}",
    ).assert_success()
    attached = run_factory.cli("jobs", "attach", str(job_dir), timeout=120).assert_success()
    assert "train epoch" in attached.stdout and "ranks ended with exit status 0" in attached.stdout
    assert json.loads((job_dir / "result.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_a_plain_scancel_is_reported_as_cancelled(slurm_cluster: str, tmp_path: Path) -> None:
    """Slurm's own cancel (not ddlkit's): SIGTERM to every process of the job, then the end."""
    job_dir = tmp_path / "scancelled"
    job_dir.mkdir()
    (job_dir / "job.json").write_text("{}")
    handle = slurm_target().submit(
        JobSpec(
            name="scancelled", job_dir=job_dir, args=("-c", "import time; print('up', flush=True); time.sleep(600)")
        )
    )
    log = job_dir / "slurm.log"
    wait_for(lambda: log.exists() and "up" in log.read_text(), "the job to run", timeout=60)
    subprocess.run(["scancel", handle.id], check=True)
    status = handle.wait(timeout=60)
    assert status.state is JobState.CANCELLED, status
    assert settled_state(handle.id) == "CANCELLED"
    assert "stopped by Slurm" in (job_dir / "slurm.log").read_text()


@pytest.mark.slow
def test_an_error_in_rank_0_is_not_restarted_whatever_srun_reports(slurm_cluster: str, run_factory: RunFactory) -> None:
    """Rank 0 of 2 raises at step 3 (exit 1); srun then stops rank 1, which checkpoints and exits 75, and
    srun's status (the batch job's ExitCode) is that of whichever task it reports. The job is judged by
    the rank that failed first, as on compute=local_mpi: the job's own error, never restarted."""
    outcome = run_factory(
        "framework=fake",
        "compute=slurm",
        "compute.poll_interval_s=0.5",
        "compute.procs_per_node=2",
        "dist=native",
        "data.image_size=8",
        "data.num_classes=4",
        "data.length=256",
        "data.val_length=32",
        "trainer.batch_size=16",
        "trainer.epochs=2",
        "trainer.log_every=1",
        "trainer.checkpoint_every=4",
        "restart.backoff_s=0",
        "framework.step_delay_s=0.1",
        "framework.fail_at_step=3",
        "framework.fail_rank=0",
        timeout=300,
    )
    outcome.assert_returncode(1)
    assert "ddlkit: restart" not in outcome.stdout, outcome.stdout
    assert " failed (not restarted: an error in the job's own code or data (exit status 1)): " in outcome.stderr, (
        outcome.stderr
    )
    assert re.search(r"rank 0 \(node 0, host [^)]+\) failed first, with exit status 1", outcome.stderr), outcome.stderr
    record = submission(outcome.job_dir)
    assert record["restarts"] == []
    assert settled_state(record["id"]) == "FAILED"


@pytest.mark.slow
def test_a_rank_killed_on_slurm_restarts_the_job_as_a_new_slurm_job(
    slurm_cluster: str, run_factory: RunFactory
) -> None:
    """The restart policy on the real local Slurm: rank 1 of 2 is killed (SIGKILL, a lost node) in
    step 7; the launcher submits the job again (a new Slurm job, in the same job directory), which
    resumes from the checkpoint at step 4 and completes. The final checkpoint verifies, the steps add
    up, and `ddlkit jobs status` shows the resubmission."""

    outcome = run_factory(
        "framework=fake",
        "compute=slurm",
        "compute.poll_interval_s=0.5",
        "compute.procs_per_node=2",
        "dist=native",
        "data.image_size=8",
        "data.num_classes=4",
        "data.length=256",
        "data.val_length=32",
        "trainer.batch_size=16",
        "trainer.epochs=2",
        "trainer.log_every=1",
        "trainer.checkpoint_every=4",
        "trainer.deterministic=true",
        "restart.backoff_s=0",
        "framework.kill_at_step=7",
        "framework.kill_rank=1",
        timeout=600,
    ).assert_success()
    assert (
        "ddlkit: restart 1/3: a rank was killed by SIGKILL from outside (a lost node, a preemption); it ended at "
        "step 6 (" in outcome.stdout
    ), outcome.stdout
    assert "resuming from step 4 in 0 s" in outcome.stdout
    result = outcome.result
    assert (result["steps"], result["restarts"], result["steps_lost"], result["resumed_from_step"]) == (16, 1, 2, 4)
    assert verify(latest_checkpoint(outcome.job_dir)) is None
    record = submission(outcome.job_dir)
    [entry] = record["restarts"]
    assert (entry["step_reached"], entry["resumed_from"], entry["steps_lost"]) == (6, 4, 2)
    # two Slurm jobs: the one that lost its rank, and the resubmission that completed
    assert entry["ended_id"] != record["id"]
    assert settled_state(entry["ended_id"]) == "FAILED" and settled_state(record["id"]) == "COMPLETED"
    status = run_factory.cli("jobs", "status", str(outcome.job_dir)).assert_success()
    assert f"; it ended at step 6 as {entry['ended_id']} (" in status.stdout, status.stdout
    assert f"target:    compute=slurm, id {record['id']}" in status.stdout


@pytest.mark.slow
def test_a_stopped_rank_on_slurm_gets_the_others_stacks_written_and_is_named(
    slurm_cluster: str, tmp_path: Path
) -> None:
    """Issue 42: the hang report works where srun starts the ranks -- rank 2 is stopped (SIGSTOP),
    ranks 0 and 1 write their stacks into the shared job directory, and rank 0 names rank 2."""
    from ddlkit.testing.multirank import worker_pids

    job_dir = tmp_path / "hung"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            "compute=slurm",
            "compute.procs_per_node=3",
            "dist=native",
            "compute.poll_interval_s=0.5",
            "dist.warn_after_s=3",
            "restart.max_restarts=0",
            *SLOW,
            f"hydra.run.dir={job_dir}",
        ],
        env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        log = job_dir / "slurm.log"
        wait_for(lambda: log.exists() and "step 10/" in log.read_text(), "the job to train", timeout=90, process=proc)
        os.kill(worker_pids(job_dir)[2], signal.SIGSTOP)
        report = "ddlkit: rank 2 does not answer"
        wait_for(lambda: report in log.read_text(), "rank 0's hang report", timeout=60, process=proc)
    finally:
        subprocess.run(["scancel", submission(job_dir)["id"]], check=False)
        for pid in worker_pids(job_dir).values():
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "ddlkit: stacks of rank(s) 0, 1 written to hang/" in text, text
    assert "ddlkit: rank(s) 0, 1 wait in " in text, text
    for rank in (0, 1):
        stacks = (job_dir / f"hang/rank-{rank}.txt").read_text()
        assert stacks.startswith(f"# rank {rank} of 3 on ") and "in train_epochs" in stacks, stacks[:500]


@pytest.mark.slow
def test_telemetry_profiler_and_mlflow_work_under_srun(
    slurm_cluster: str, run_factory: RunFactory, tmp_path: Path
) -> None:
    """Issue 42 on Slurm: a 2-rank PyTorch job that srun starts writes each rank's profiler trace into
    the shared job directory, logs one MLflow run (rank 0's) with the steps and every rank's
    telemetry, puts the ranks' fields in metrics.jsonl and telemetry.json, and `ddlkit jobs status`
    shows the ranks."""
    pytest.importorskip("ddlkit_pytorch")
    pytest.importorskip("ddlkit_mlflow")
    from ddlkit.testing.multirank import OBSERVED_JOB, OBSERVED_STEPS, assert_every_rank_seen
    from ddlkit_mlflow.testing import MlflowServer, runs_of, steps

    (tmp_path / "mlflow").mkdir()
    with MlflowServer(tmp_path / "mlflow") as server:
        outcome = run_factory(
            *OBSERVED_JOB,
            f"logger.mlflow.tracking_uri={server.uri}",
            "logger.mlflow.experiment=on-slurm",
            "compute=slurm",
            "compute.procs_per_node=2",
            "compute.poll_interval_s=0.5",
            timeout=240,
        ).assert_success()
        runs = runs_of(server.uri, "on-slurm")
        history = {
            key: [step for step, _ in steps(server.uri, runs[0].info.run_id, key)]
            for key in ("train/loss", *(f"train/rank{r}/{f}" for r in (0, 1) for f in ("images_per_sec", "data_wait")))
        }
    job_dir = outcome.job_dir
    assert outcome.stdout.count("ddlkit: profile of steps 3-4 written to profile/") == 1, outcome.output
    # one run, rank 0's, with the logged steps and each rank's figures at them
    assert len(runs) == 1 and (runs[0].info.status, runs[0].data.tags["ddlkit.compute"]) == ("FINISHED", "slurm")
    assert history == dict.fromkeys(history, OBSERVED_STEPS), history
    assert_every_rank_seen(job_dir)
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout
    assert "ranks:     at step 6" in status, status
    assert re.findall(r"^\s+(\d)\s+0\s+\S+\s+[\d.]+\s+\d+%\s+\d+%", status, re.M) == ["0", "1"], status
