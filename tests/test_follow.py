"""The launcher side: submitting, streaming, and turning a job's end into a result or an error."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlkit import ComputeTarget, JobFailedError, JobHandle, JobSpec, JobState, JobStatus
from ddlkit.checkpoint import CHECKPOINT_DIR, LATEST, checkpoint_name
from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.launch.follow import run_job
from ddlkit.launch.prepare import PreparedJob, environment_info
from ddlkit.testing import wait_for


class StubHandle(JobHandle):
    def __init__(self, status: JobStatus, chunks: list[str]) -> None:
        self.id, self._status, self.chunks, self.cancelled = "stub:1", status, chunks, False

    def status(self) -> JobStatus:
        return self._status

    def logs(self, follow: bool = True) -> Iterator[str]:
        yield from self.chunks

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self._status


class StubTarget(ComputeTarget):
    """Finishes every job at once with a preset status, optionally writing result.json first."""

    def __init__(self, status: JobStatus, chunks: list[str], result: dict | None = None) -> None:
        super().__init__(None)
        self.handle, self.result, self.submitted = StubHandle(status, chunks), result, []

    def submit(self, spec: JobSpec) -> JobHandle:
        self.submitted.append(spec)
        if self.result is not None:
            (spec.job_dir / "result.json").write_text(json.dumps(self.result))
        return self.handle


def job(tmp_path: Path, target: ComputeTarget) -> PreparedJob:
    spec = JobSpec(name="2026-01-01_00-00-00", job_dir=tmp_path)
    # following and concluding one run of a job: the restart policy has its own tests
    # (tests/jobs/test_restart_policy.py)
    return PreparedJob(
        spec,
        target,
        redacted_config={"logger": {"jsonl": {}}, "compute": {"name": "stub"}, "restart": {"max_restarts": 0}},
        overrides=("trainer.epochs=2", "hydra.run.dir=old/dir", "model=resnet50"),
    )


def test_success_streams_the_log_and_returns_the_result(tmp_path: Path) -> None:
    target = StubTarget(JobStatus(JobState.SUCCEEDED, 0), ["train step 1\n", "train step 2\n"], result={"steps": 2})
    out = io.StringIO()
    assert run_job(job(tmp_path, target), out=out, live=False) == {"steps": 2}
    assert out.getvalue() == (
        f"ddlkit: job 2026-01-01_00-00-00 -> {tmp_path}\n"
        "train step 1\ntrain step 2\n"
        f"ddlkit: done; result in {tmp_path}/result.json\n"
    )
    assert [s.name for s in target.submitted] == ["2026-01-01_00-00-00"]


class QueuedHandle(StubHandle):
    """A job that waits: its target tells ``states`` in turn, one per look (the last one stays), and
    its first output comes only after the launcher has looked past the last one."""

    def __init__(self, states: list[JobStatus]) -> None:
        super().__init__(JobStatus(JobState.SUCCEEDED, 0), ["train step 1\n"])
        self.states, self.looks = states, 0

    def status(self) -> JobStatus:
        self.looks += 1
        return self.states[min(self.looks, len(self.states)) - 1]

    def logs(self, follow: bool = True) -> Iterator[str]:
        wait_for(
            lambda: self.looks > len(self.states), "the launcher to look past the last state", timeout=30, pace=0.01
        )
        yield from self.chunks


def test_a_waiting_job_says_its_state_and_why_until_its_first_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ddlkit.launch.follow.NOTICE_AFTER_S", 0.01)
    target = StubTarget(JobStatus(JobState.SUCCEEDED, 0), [], result={"steps": 1})
    target.handle = QueuedHandle(
        [
            JobStatus(JobState.PENDING, None, "queue: Resources"),
            JobStatus(JobState.PENDING, None, "queue: Resources"),
            JobStatus(JobState.PENDING, None, "queue: Priority"),
            JobStatus(JobState.RUNNING),
        ]
    )
    out = io.StringIO()
    run_job(job(tmp_path, target), out=out, live=False)
    assert out.getvalue().splitlines()[1:] == [
        "ddlkit: job pending (queue: Resources), no output yet",  # once, then on each change
        "ddlkit: job pending (queue: Priority), no output yet",
        "ddlkit: job running, no output yet",
        "train step 1",
        f"ddlkit: done; result in {tmp_path}/result.json",
    ]


def a_checkpoint(job_dir: Path) -> None:
    (job_dir / CHECKPOINT_DIR / checkpoint_name(5)).mkdir(parents=True)
    (job_dir / CHECKPOINT_DIR / LATEST).write_text(checkpoint_name(5))


def test_success_without_a_result_file_is_a_failure(tmp_path: Path) -> None:
    target = StubTarget(JobStatus(JobState.SUCCEEDED, 0), [])
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, target), out=io.StringIO(), live=False)
    assert str(info.value) == (
        f"job 2026-01-01_00-00-00 failed: the job exited cleanly but wrote no {tmp_path}/result.json"
    )


@pytest.mark.parametrize(
    "status",
    [
        JobStatus(JobState.FAILED, 1, "rank 0 ended with exit status 1; last lines: ModuleNotFoundError: No module"),
        JobStatus(JobState.FAILED, -9, "rank 0 ended with killed by signal SIGKILL"),
        JobStatus(JobState.CANCELLED, 0, "Slurm job 7 was cancelled (None); last lines: (no log)"),
    ],
)
def test_a_job_that_ended_without_a_checkpoint_has_nothing_to_resume(tmp_path: Path, status: JobStatus) -> None:
    """A failure before training (an import error, a bad shape), or a job cancelled before it
    started: the message names the cause, and no `resume with:` promises what cannot be."""
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, StubTarget(status, [])), out=io.StringIO(), live=False)
    assert str(info.value) == f"job 2026-01-01_00-00-00 {status.state.value}: {status.message}"


def test_a_failed_job_raises_with_its_exit_code_and_a_resume_hint(tmp_path: Path) -> None:
    a_checkpoint(tmp_path)
    target = StubTarget(JobStatus(JobState.FAILED, 3, "rank 0 ended with exit status 3; last lines: boom"), [])
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, target), out=io.StringIO(), live=False)
    assert info.value.exit_code == 3
    assert str(info.value) == (
        "job 2026-01-01_00-00-00 failed: rank 0 ended with exit status 3; last lines: boom\n"
        f"  resume with: ddlkit trainer.epochs=2 model=resnet50 hydra.run.dir={tmp_path}"
    )


TAIL = "    step 5 loss 1.0\n    Traceback (most recent call last):\n      File 'x.py'\n    ValueError: bad data\n"


@pytest.mark.parametrize(
    ("tail", "error"),
    [
        (TAIL, "ValueError: bad data"),
        (TAIL + "    ddlkit worker (rank 0): ConfigError: bad data\n", "ddlkit worker (rank 0): ConfigError: bad data"),
        ("    step 5 loss 1.0\n", "step 5 loss 1.0"),
    ],
)
@pytest.mark.parametrize("then", ["", "\n  then rank 1: exit status 76"])
def test_the_error_says_rank_0s_error_in_one_line_not_the_log_lines_the_console_just_showed(
    tmp_path: Path, tail: str, error: str, then: str
) -> None:
    """Issue 37, item 15: the console showed the rank's log, then the error repeated its last lines.
    The error keeps the line that says what went wrong, so stderr alone still tells."""
    message = f"rank 0 ended with exit status 2; last lines of {tmp_path / 'rank-0.log'}:\n{tail.rstrip()}{then}"
    target = StubTarget(JobStatus(JobState.FAILED, 2, message), [tail])
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, target), out=io.StringIO(), live=False)
    assert str(info.value) == (
        f"job 2026-01-01_00-00-00 failed: rank 0 ended with exit status 2: {error} "
        f"(the whole log: {tmp_path / 'rank-0.log'}){then}"
    )


def test_another_ranks_log_lines_stay_whole(tmp_path: Path) -> None:
    """The console streamed rank 0's log only: rank 1's lines are news."""
    message = f"rank 1 failed first, with exit status 1; last lines of {tmp_path / 'rank-1.log'}:\n{TAIL.rstrip()}"
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, StubTarget(JobStatus(JobState.FAILED, 1, message), [])), out=io.StringIO(), live=False)
    assert str(info.value) == f"job 2026-01-01_00-00-00 failed: {message}"


def test_a_job_killed_by_a_signal_exits_1(tmp_path: Path) -> None:
    target = StubTarget(JobStatus(JobState.FAILED, -9, "killed by signal SIGKILL"), [])
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, target), out=io.StringIO(), live=False)
    assert info.value.exit_code == 1


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_preempted_job_says_how_to_resume(tmp_path: Path, checkpointed: bool) -> None:
    """Stopped while running: resumable, also before its first checkpoint (the same command starts it again)."""
    if checkpointed:
        a_checkpoint(tmp_path)
    target = StubTarget(JobStatus(JobState.FAILED, EXIT_PREEMPTED, "stopped"), [])
    with pytest.raises(JobFailedError) as info:
        run_job(job(tmp_path, target), out=io.StringIO(), live=False)
    assert info.value.exit_code == EXIT_PREEMPTED
    saved = "after saving a checkpoint" if checkpointed else "before its first checkpoint"
    assert str(info.value) == (
        f"job 2026-01-01_00-00-00 stopped {saved}; resume with: ddlkit "
        f"trainer.epochs=2 model=resnet50 hydra.run.dir={tmp_path}"
    )


def test_resume_hint_quotes_for_the_shell(tmp_path: Path) -> None:
    spec = JobSpec(name="j", job_dir=tmp_path / "my job")
    prepared = PreparedJob(spec, StubTarget(JobStatus(JobState.SUCCEEDED), []), {}, ("logger=[console,jsonl]",))
    assert prepared.resume_hint == f"resume with: ddlkit 'logger=[console,jsonl]' 'hydra.run.dir={tmp_path}/my job'"


@pytest.mark.plugins  # framework=pytorch and logger=wandb: ddlkit-pytorch's and ddlkit-wandb's versions
def test_environment_info_records_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import version

    from ddlkit.plugins import get_plugin_manager, installed_registry
    from ddlkit.testing import compose

    monkeypatch.setattr("sys.argv", ["ddlkit", "storage.account_key=abcdef", "trainer.epochs=1"])
    registry = installed_registry()
    info = environment_info(compose(registry, ["framework=pytorch"]), registry, get_plugin_manager())
    assert info["packages"]["ddlkit"] == version("ddlkit")
    assert info["packages"]["pluggy"] == version("pluggy")
    # the selected framework's plugin and the library it names; not what the job does not use
    assert info["packages"]["ddlkit-pytorch"] == version("ddlkit-pytorch")
    assert info["packages"]["torch"] == version("torch")
    assert "tensorflow-cpu" not in info["packages"] and "wandb" not in info["packages"]
    with_wandb = environment_info(
        compose(registry, ["framework=pytorch", "logger=[console,wandb]"]), registry, get_plugin_manager()
    )
    assert with_wandb["packages"]["wandb"] == version("wandb")
    assert info["argv"] == ["ddlkit", "storage.account_key=***", "trainer.epochs=1"]
    assert info["git"] is None  # the test runs in tmp_path, outside any repository


def test_the_end_of_a_run_says_how_much_disk_its_directory_takes(tmp_path: Path) -> None:
    from ddlkit.launch.follow import footprint

    (tmp_path / "checkpoints").mkdir()
    for step in (1, 2):
        with open(tmp_path / "checkpoints" / f"step-{step}.ckpt", "wb") as f:
            f.truncate(60_000_000)
    with open(tmp_path / "model.pt", "wb") as f:
        f.truncate(30_000_000)
    (tmp_path / "result.json").write_text("{}")
    assert footprint(tmp_path) == (
        "ddlkit: the job directory holds 150 MB (checkpoints/ 120 MB, model.pt 30 MB): "
        "trainer.keep_checkpoints=1 and trainer.save_model=false keep it smaller\n"
    )
    (tmp_path / "model.pt").unlink()
    for step in (1, 2):
        (tmp_path / "checkpoints" / f"step-{step}.ckpt").unlink()
    assert footprint(tmp_path) == ""  # small: nothing to say
