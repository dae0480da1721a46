"""The rank side: lifecycle hooks in order, failure and preemption statuses, worker exit
codes, and resume equivalence, all on an in-process worker with the fake framework."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ddlkit
from ddlkit import RunError
from ddlkit.checkpoint import verify
from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.testing import RESULT_KEYS, HookRecorder, add_plugin, make_run
from ddlkit.testing.fakes import MODEL_FILE

# 10 steps per epoch of 32 images, 2 epochs, a log line every 5 steps
SMALL = ("data.length=320", "data.val_length=64", "data.num_classes=10", "trainer.log_every=5")


def events(recorder: HookRecorder) -> list[tuple]:
    """Hook calls as (name, the argument that tells them apart)."""
    detail = {
        "ddlkit_step_end": "step",
        "ddlkit_epoch_end": "epoch",
        "ddlkit_checkpoint_saved": "step",
        "ddlkit_run_end": "status",
    }
    return [(c.name, c[detail[c.name]]) if c.name in detail else (c.name,) for c in recorder.calls]


def test_hooks_fire_in_order(run_inprocess, hook_recorder: HookRecorder) -> None:
    # each checkpoint written before the run goes on (a checkpoint in the background is announced
    # when it is complete: test_a_checkpoint_written_in_the_background_...)
    out = run_inprocess(*SMALL, "trainer.max_steps=15", "trainer.checkpoint_async=false")
    assert out.exit_code == 0
    assert events(hook_recorder) == [
        ("ddlkit_configure",),  # launcher side, while validating
        ("ddlkit_job_environment",),  # launcher side, while writing the job
        ("ddlkit_run_loop",),
        ("ddlkit_run_start",),
        ("ddlkit_step_end", 5),
        ("ddlkit_step_end", 10),
        ("ddlkit_epoch_end", 1),
        ("ddlkit_checkpoint_saved", 10),
        ("ddlkit_step_end", 15),
        ("ddlkit_checkpoint_saved", 15),  # max_steps reached mid-epoch: saved at once, no epoch end
        ("ddlkit_run_end", "completed"),
    ]
    assert all(c["run"] is out.run for c in hook_recorder.calls if "run" in c.kwargs)
    step = hook_recorder.getcalls("ddlkit_step_end")[0]
    assert set(step["metrics"]) == {"loss", "lr", "images_per_sec", "epoch"}
    assert step["metrics"]["epoch"] == 0.5
    epoch_metrics = hook_recorder.getcall("ddlkit_epoch_end")["metrics"]
    assert set(epoch_metrics) == {"val_loss", "val_top1", "val_top5"}
    saved = hook_recorder.getcalls("ddlkit_checkpoint_saved")[-1]
    assert Path(saved["path"]) == out.job_dir / "checkpoints" / "step-00000015.ckpt"
    end = hook_recorder.getcall("ddlkit_run_end")
    assert end["result"] == out.result and end["result"]["steps"] == 15


def test_a_full_run_ends_each_epoch_and_checkpoints_the_last_step(run_inprocess, hook_recorder) -> None:
    out = run_inprocess(*SMALL)
    assert [c["epoch"] for c in hook_recorder.getcalls("ddlkit_epoch_end")] == [1, 2]
    # one checkpoint per epoch end: the last step is not saved a second time
    assert [c["step"] for c in hook_recorder.getcalls("ddlkit_checkpoint_saved")] == [10, 20]
    assert hook_recorder.names()[-1] == "ddlkit_run_end"
    assert (out.result["epochs"], out.result["steps"], out.result["status"]) == (2, 20, "completed")
    assert sorted(p.name for p in (out.job_dir / "checkpoints").iterdir()) == [
        "latest",
        "step-00000010.ckpt",
        "step-00000010.ckpt.manifest.json",
        "step-00000020.ckpt",
        "step-00000020.ckpt.manifest.json",
    ]


def _checkpoint(path: Path) -> dict[str, object]:
    """A fake framework's checkpoint as values: its arrays and its meta (a zip's bytes hold the time)."""
    with np.load(path, allow_pickle=False) as ckpt:
        return {key: ckpt[key].tolist() for key in ckpt.files}


def test_a_checkpoint_written_in_the_background_lets_training_go_on_and_holds_the_same_state(
    run_inprocess, hook_recorder: HookRecorder
) -> None:
    """A slow disk (each write waits 1 s): the checkpoint of step 10 is complete only after step
    15 trained, announced then, and holds step 10's state exactly as a write on the training
    thread does; the run's last checkpoint is complete before the run ends."""
    at_once = run_inprocess(*SMALL, "trainer.max_steps=15", "trainer.checkpoint_async=false")
    hook_recorder.calls.clear()
    out = run_inprocess(*SMALL, "trainer.max_steps=15", "framework.save_delay_s=1")
    assert out.exit_code == 0
    assert events(hook_recorder)[-5:] == [
        ("ddlkit_epoch_end", 1),
        ("ddlkit_step_end", 15),
        ("ddlkit_checkpoint_saved", 10),
        ("ddlkit_checkpoint_saved", 15),
        ("ddlkit_run_end", "completed"),
    ]
    for name in ("step-00000010.ckpt", "step-00000015.ckpt"):
        assert verify(out.job_dir / "checkpoints" / name) is None
        assert _checkpoint(out.job_dir / "checkpoints" / name) == _checkpoint(at_once.job_dir / "checkpoints" / name)
    assert (out.job_dir / "checkpoints" / "latest").read_text() == "step-00000015.ckpt\n"
    assert (out.job_dir / MODEL_FILE).read_bytes() == (at_once.job_dir / MODEL_FILE).read_bytes()


def test_result_says_how_long_the_checkpoints_held_the_training_thread(run_inprocess) -> None:
    """A slow disk (each write waits 1 s): the checkpoint of step 10, taken while training goes on,
    holds the training thread for its copy only when it is written in the background, for the whole
    write when not; the run's last checkpoint (step 15) is not a stall of training."""
    slow = (*SMALL, "trainer.max_steps=15", "framework.save_delay_s=1")
    synchronous = run_inprocess(*slow, "trainer.checkpoint_async=false").result["checkpoint_stall_s"]
    background = run_inprocess(*slow).result["checkpoint_stall_s"]
    assert (synchronous["checkpoints"], synchronous["background"]) == (1, False), synchronous
    assert (background["checkpoints"], background["background"]) == (1, True), background
    assert synchronous["median"] == synchronous["max"] == synchronous["total"] >= 1.0, synchronous
    assert background["max"] < 0.5, background
    assert run_inprocess(*SMALL, "trainer.max_steps=5").result["checkpoint_stall_s"] is None


def test_the_checkpoint_checksum_is_a_setting(run_inprocess) -> None:
    out = run_inprocess(*SMALL, "trainer.max_steps=5", "trainer.checkpoint_checksum=sha256")
    manifest = json.loads((out.job_dir / "checkpoints" / "step-00000005.ckpt.manifest.json").read_text())
    [entry] = manifest["files"].values()
    assert set(entry) == {"size", "sha256"} and manifest["version"] == 2
    assert verify(out.job_dir / "checkpoints" / "step-00000005.ckpt") is None


def test_a_run_that_fails_while_a_checkpoint_is_written_completes_it(run_inprocess, hook_recorder) -> None:
    out = run_inprocess(*SMALL, "framework.fail_at_step=12", "framework.save_delay_s=1")
    assert (out.exit_code, out.run.state.step) == (1, 11)
    assert [c["step"] for c in hook_recorder.getcalls("ddlkit_checkpoint_saved")] == [10]
    ckdir = out.job_dir / "checkpoints"
    assert (ckdir / "latest").read_text() == "step-00000010.ckpt\n" and verify(ckdir / "step-00000010.ckpt") is None
    assert not [p.name for p in ckdir.iterdir() if p.name.endswith(".tmp")]


def test_a_failing_framework_ends_the_run_as_failed(
    run_inprocess, hook_recorder: HookRecorder, capsys: pytest.CaptureFixture
) -> None:
    out = run_inprocess(*SMALL, "framework.fail_at_step=7", "logger=[recording]")
    assert out.exit_code == 1
    end = hook_recorder.getcall("ddlkit_run_end")
    assert (end["status"], end["result"]) == ("failed", None)
    assert hook_recorder.names()[-1] == "ddlkit_run_end"
    assert out.run.state.step == 6
    assert not (out.job_dir / "result.json").exists()
    (logger,) = out.run.loggers
    assert logger.calls[-1].method == "finish" and logger.calls[-1].status == "failed"
    # the traceback goes to the rank's log (stderr), for the launcher to show
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: fake framework failure at step 7" in err


def test_a_run_error_is_reported_without_a_traceback(run_inprocess, ddlkit_pm, capsys) -> None:
    class Diverge:
        @ddlkit.hookimpl
        def ddlkit_step_end(self, step):
            if step == 5:
                raise RunError("loss exploded", component="framework", step=step)

    add_plugin(ddlkit_pm, Diverge())
    out = run_inprocess(*SMALL)
    assert (out.exit_code, out.status) == (1, "failed")
    err = capsys.readouterr().err
    assert "ddlkit worker (rank 0): RunError: loss exploded" in err and "Traceback" not in err


def test_a_config_error_in_the_worker_exits_2(run_inprocess, ddlkit_pm, capsys) -> None:
    class Picky:
        @ddlkit.hookimpl
        def ddlkit_run_start(self, run):
            raise ddlkit.ConfigError("data.root=/nope does not exist on this node")

    add_plugin(ddlkit_pm, Picky())
    out = run_inprocess(*SMALL)
    assert (out.exit_code, out.status) == (2, "failed")
    assert "ConfigError: data.root=/nope does not exist on this node" in capsys.readouterr().err


def test_a_stop_request_checkpoints_and_exits_resumable(run_inprocess, ddlkit_pm, hook_recorder, capsys) -> None:
    class Preempt:
        """Does what the SIGTERM handler does, at a known step."""

        @ddlkit.hookimpl
        def ddlkit_step_end(self, run, step):
            if step == 5:
                run.stop_requested = True

    plugin = add_plugin(ddlkit_pm, Preempt())
    out = run_inprocess(*SMALL)
    assert (out.exit_code, out.status) == (EXIT_PREEMPTED, "interrupted")
    assert hook_recorder.getcalls("ddlkit_checkpoint_saved")[-1]["step"] == 5
    assert "stopped on request at step 5; checkpoint saved, resumable" in capsys.readouterr().err

    ddlkit_pm.unregister(plugin)
    again = run_inprocess(*SMALL, job_dir=out.job_dir)
    assert again.exit_code == 0
    assert (again.result["resumed_from_step"], again.result["steps"]) == (5, 20)


def _train_lines(metrics: list[dict]) -> list[tuple]:
    return [(m["step"], m["loss"], m["lr"], m["epoch"]) for m in metrics if m["split"] == "train"]


@pytest.mark.parametrize("stop", [3, 10, 13], ids=["mid-epoch", "epoch-boundary", "second-epoch"])
def test_an_interrupted_and_resumed_run_ends_like_an_uninterrupted_one(
    run_inprocess, tmp_path: Path, stop: int
) -> None:
    straight = run_inprocess(*SMALL)
    job_dir = tmp_path / "resumed"
    first = run_inprocess(*SMALL, f"trainer.max_steps={stop}", job_dir=job_dir)
    assert first.result["steps"] == stop
    resumed = run_inprocess(*SMALL, job_dir=job_dir)
    assert resumed.result["resumed_from_step"] == stop
    assert (job_dir / MODEL_FILE).read_bytes() == (straight.job_dir / MODEL_FILE).read_bytes()
    for key in ("steps", "epochs", "final_loss", "top1", "top5", "val_loss", "peak_lr"):
        assert resumed.result[key] == straight.result[key], key
    # metrics.jsonl was cut back to the checkpoint, so no step is logged twice; the first run
    # also logged its last step, a line the straight run does not have
    lines, expected = _train_lines(resumed.metrics), _train_lines(straight.metrics)
    steps = [line[0] for line in lines]
    assert steps == sorted(set(steps))
    assert [line for line in lines if line[0] > stop] == [line for line in expected if line[0] > stop]
    assert {line for line in expected if line[0] <= stop} <= set(lines)


def test_resume_refuses_a_checkpoint_of_another_model(run_inprocess, tmp_path: Path, capsys) -> None:
    job_dir = tmp_path / "job"
    run_inprocess(*SMALL, "trainer.max_steps=3", job_dir=job_dir)
    out = run_inprocess(*SMALL, "model=resnet50", job_dir=job_dir)
    assert (out.exit_code, out.status) == (2, "failed")
    assert (
        f"ConfigError: checkpoint {job_dir}/checkpoints/step-00000003.ckpt was written with model=resnet18, "
        "this run has model=resnet50."
    ) in capsys.readouterr().err


def test_result_json_reports_the_run(run_inprocess) -> None:
    result = run_inprocess(*SMALL, "trainer.batch_size=16").result
    assert result == {
        **result,
        "status": "completed",
        "framework": "fake",
        "model": "resnet18",
        "data": "synthetic",
        "world_size": 1,
        "batch_size_per_rank": 16,
        "global_batch_size": 16,
        "precision": "fp32",
        "epochs": 2,
        "steps": 40,
        "steps_per_epoch": 20,
        "warmup_steps": 5,
        "peak_lr": 0.1 * 16 / 256,
        "resumed_from_step": None,
    }
    # 40 steps, minus 5 warm-up, minus the first step after the validation pause
    assert result["measured_steps"] == 34
    assert result["images_per_sec"] > 0 and result["wall_time_s"] > 0
    assert 0 <= result["top1"] <= result["top5"] <= 1 and result["best_top1"] >= result["top1"]
    assert set(result) == RESULT_KEYS  # the test kit's list is the core's (no plugin adds keys here)


def test_a_diverging_loss_is_a_run_error(ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", "trainer.log_every=1", "logger=[]")
    with pytest.raises(RunError) as info:
        run.step_end(loss=float("nan"), lr=0.1)
    assert str(info.value) == (
        "loss became nan at step 1: training diverged. Lower optimizer.lr or raise optimizer.warmup_epochs."
    )
    assert (info.value.component, info.value.step) == ("framework", 1)


def test_the_loss_is_read_only_at_logging_steps(ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", "trainer.log_every=3", "logger=[]")
    reads = []

    def loss() -> float:  # a device-side loss costs a synchronisation to read
        reads.append(run.state.step)
        return 1.0

    for _ in range(7):
        run.step_end(loss=loss, lr=0.1)
    assert reads == [3, 6]


class _PeersNeverAskToStop:
    """Two ranks' control plane, seen from this rank: the other rank never asks to stop, and a
    SIGTERM reaches this rank while it waits in the first exchange (after sending its flag)."""

    world_size, rank, is_main = 2, 0, True

    def __init__(self, run: ddlkit.Run) -> None:
        self.run, self.calls = run, 0

    def allreduce_mean(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(metrics)

    def any(self, flag: bool) -> bool:
        self.calls += 1
        if self.calls == 1:
            self.run.stop_requested = True  # what the SIGTERM handler does, mid-exchange
        return flag


def test_a_sigterm_during_the_stop_agreement_is_not_lost(ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", "logger=[]", "dist.stop_check_every=1")
    run.dist = _PeersNeverAskToStop(run)
    assert run.step_end(loss=1.0, lr=0.1) is False  # the exchange had already sent "no"
    with pytest.raises(ddlkit.rank.preemption.Preempted):
        run.step_end(loss=1.0, lr=0.1)  # the next agreement carries the request
    assert run.state.step == 2


def test_too_little_data_for_one_global_batch(ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> None:
    with pytest.raises(ddlkit.ConfigError) as info:
        make_run(ddlkit_pm, tmp_path / "job", "data.length=16", "trainer.batch_size=32")
    assert str(info.value) == (
        "data has 16 training images, fewer than one global batch of 32 "
        "(trainer.batch_size=32 x 1 ranks). Lower trainer.batch_size or raise data.length."
    )


def test_a_source_whose_size_only_the_ranks_know_is_checked_by_the_run(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path
) -> None:
    """data=custom states no size in its config: the launcher passes it, the Run refuses it."""
    with pytest.raises(ddlkit.ConfigError) as info:
        make_run(
            ddlkit_pm,
            tmp_path / "job",
            "data=custom",
            "data.target=ddlkit.testing.optim:linear_data",
            "data.num_classes=3",
            "trainer.batch_size=32",
        )
    assert str(info.value) == (
        "data has 16 training images, fewer than one global batch of 32 "
        "(trainer.batch_size=32 x 1 ranks). Lower trainer.batch_size or raise data.length."
    )


def test_restore_still_checkpoints_and_starts_with_a_deprecation_warning(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, hook_recorder: HookRecorder
) -> None:
    """0.1's framework contract, for framework plugins outside this repository, until 0.2."""
    run = make_run(ddlkit_pm, tmp_path / "job", "logger=[recording]")
    with pytest.warns(DeprecationWarning, match=r"run.checkpointing\(save, load\), then run.start\(\)"):
        state = run.restore(lambda path, meta: None, lambda path: {})
    assert state == ddlkit.rank.run.RunState()
    assert hook_recorder.names() == ["ddlkit_configure", "ddlkit_run_start"]
    (logger,) = run.loggers
    assert [c.method for c in logger.calls] == ["start"]


def test_job_file_is_what_the_worker_reads(run_inprocess) -> None:
    out = run_inprocess(*SMALL, "trainer.epochs=1")
    job = json.loads((out.job_dir / "job.json").read_text())
    assert job["config"]["trainer"]["epochs"] == 1 and job["config"]["framework"]["name"] == "fake"
    assert out.run.cfg.trainer.epochs == 1


# ---------------------------------------------------------------------------- resume never silently loses progress
# issue 17, items 5-7, end to end on the in-process worker


def _interrupted_at_15(run_inprocess, job_dir: Path, *overrides: str) -> Path:
    """A run stopped at step 15 (checkpoints at steps 10 and 15, ``latest`` naming 15)."""
    first = run_inprocess(*SMALL, *overrides, "trainer.max_steps=15", job_dir=job_dir)
    assert first.exit_code == 0
    ckdir = job_dir / "checkpoints"
    assert (ckdir / "latest").read_text() == "step-00000015.ckpt\n"
    return ckdir


def test_resume_when_latest_names_a_deleted_checkpoint(run_inprocess, tmp_path: Path, capsys) -> None:
    """Item 5: it started from step 0 without a word; now it resumes from the newest intact checkpoint."""
    straight = run_inprocess(*SMALL)
    ckdir = _interrupted_at_15(run_inprocess, tmp_path / "job")
    (ckdir / "step-00000015.ckpt").unlink()
    capsys.readouterr()
    resumed = run_inprocess(*SMALL, job_dir=tmp_path / "job")
    assert resumed.exit_code == 0
    assert resumed.result["resumed_from_step"] == 10
    err = capsys.readouterr().err
    assert f"ddlkit: warning: {ckdir}/latest names step-00000015.ckpt, which does not exist (deleted?)" in err
    assert f"ddlkit: warning: resuming from {ckdir}/step-00000010.ckpt, the newest intact checkpoint" in err
    assert (tmp_path / "job" / MODEL_FILE).read_bytes() == (straight.job_dir / MODEL_FILE).read_bytes()


def test_resume_passes_over_a_truncated_latest_checkpoint(run_inprocess, tmp_path: Path, capsys) -> None:
    """Item 6: a truncated latest checkpoint is named and passed over; nothing is deleted until a
    newer checkpoint is complete, and the run ends as an uninterrupted one."""
    straight = run_inprocess(*SMALL)
    ckdir = _interrupted_at_15(run_inprocess, tmp_path / "job")
    bad = ckdir / "step-00000015.ckpt"
    size = bad.stat().st_size
    with open(bad, "r+b") as f:
        f.truncate(size // 2)
    capsys.readouterr()
    resumed = run_inprocess(*SMALL, job_dir=tmp_path / "job")
    assert resumed.exit_code == 0
    assert (resumed.result["resumed_from_step"], resumed.result["steps"]) == (10, 20)
    err = capsys.readouterr().err
    assert (
        f"ddlkit: warning: checkpoint {bad} is damaged: step-00000015.ckpt is {size // 2} bytes, {size} were "
        "written (truncated); skipped"
    ) in err
    assert f"resuming from {ckdir}/step-00000010.ckpt, the newest intact checkpoint" in err
    assert "Traceback" not in err
    assert (tmp_path / "job" / MODEL_FILE).read_bytes() == (straight.job_dir / MODEL_FILE).read_bytes()
    assert (ckdir / "latest").read_text() == "step-00000020.ckpt\n"
    # step 10 went only once step 20 was complete and verified (keep_checkpoints=2); the damaged
    # one is kept for inspection, not silently deleted by the resume
    assert sorted(p.name for p in ckdir.glob("step-*.ckpt")) == ["step-00000015.ckpt", "step-00000020.ckpt"]


def test_resume_refuses_to_start_over_when_no_checkpoint_is_intact(run_inprocess, tmp_path: Path) -> None:
    ckdir = _interrupted_at_15(run_inprocess, tmp_path / "job", "trainer.keep_checkpoints=1")
    (ckdir / "step-00000015.ckpt").write_bytes(b"")
    with pytest.raises(ddlkit.ConfigError) as info:
        run_inprocess(*SMALL, job_dir=tmp_path / "job")
    assert str(info.value).startswith(
        f"{ckdir} holds no intact checkpoint to resume from (checkpoint "
        f"{ckdir}/step-00000015.ckpt is damaged: step-00000015.ckpt is 0 bytes"
    )
    assert "trainer.resume=false" in str(info.value)
    assert (ckdir / "step-00000015.ckpt").exists() and (ckdir / "latest").read_text() == "step-00000015.ckpt\n"
    fresh = run_inprocess(*SMALL, "trainer.resume=false", job_dir=tmp_path / "job")  # the way out it names
    assert (fresh.exit_code, fresh.result["resumed_from_step"]) == (0, None)


def test_a_load_failure_names_the_checkpoint(run_inprocess, tmp_path: Path, capsys) -> None:
    """A checkpoint without a manifest (an older ddlkit's) cannot be verified: if it fails to load,
    the error names it and the ways out, without a traceback."""
    ckdir = _interrupted_at_15(run_inprocess, tmp_path / "job")
    (ckdir / "step-00000015.ckpt.manifest.json").unlink()
    (ckdir / "step-00000015.ckpt").write_bytes(b"PK\x03\x04 not a zip")
    out = run_inprocess(*SMALL, job_dir=tmp_path / "job")
    assert (out.exit_code, out.status) == (1, "failed")
    err = capsys.readouterr().err
    assert f"RunError: cannot load checkpoint {ckdir}/step-00000015.ckpt (" in err
    assert "it has no manifest to verify it against. Resume from another checkpoint with trainer.resume=<path>" in err
    assert "Traceback" not in err


def test_stale_temporary_files_of_a_killed_checkpoint_write_are_removed(run_inprocess, tmp_path: Path, capsys) -> None:
    """Item 7 (second half): a write killed mid-way leaves ``.step-*.ckpt.*.tmp``; the next run removes it."""
    from ddlkit.atomic import atomic_path

    ckdir = _interrupted_at_15(run_inprocess, tmp_path / "job")
    killed = atomic_path(ckdir / "step-00000016.ckpt")  # never exited: as if the process died mid-write
    partial = killed.__enter__()
    partial.write_bytes(b"half a checkpoint")
    stale = partial.parent
    assert stale.name.startswith(".step-00000016.ckpt.") and stale.name.endswith(".tmp")
    capsys.readouterr()
    resumed = run_inprocess(*SMALL, job_dir=tmp_path / "job")
    assert (resumed.exit_code, resumed.result["resumed_from_step"]) == (0, 15)
    assert not stale.exists()
    assert sorted(p.name for p in ckdir.iterdir() if p.name.startswith(".")) == []
    assert (
        f"ddlkit: removed 1 stale temporary file(s) of an interrupted checkpoint write from {ckdir}: {stale.name}"
        in capsys.readouterr().out
    )
    del killed


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(
    run_inprocess, tmp_path: Path, capsys, mount_tmpfs
) -> None:
    """Item 7: the checkpoint directory fills up while writing step 15: a one-line error naming the
    directory and the intact previous checkpoint, exit 1, nothing lost; with room again the same
    command resumes from it and ends as an uninterrupted run."""
    big = ("framework.side=32", "trainer.checkpoint_every=5")  # checkpoints of ~0.5 MB, at 5, 10, 15, 20
    straight = run_inprocess(*SMALL, *big)
    job = tmp_path / "job"
    ckdir = mount_tmpfs(job / "checkpoints", "1200k")  # room for two checkpoints, not three
    out = run_inprocess(*SMALL, *big, job_dir=job)
    assert (out.exit_code, out.status) == (1, "failed")
    err = capsys.readouterr().err
    assert (
        f"ddlkit worker (rank 0): RunError: no space left on {ckdir} while writing checkpoint step 15; the "
        f"previous checkpoint {ckdir}/step-00000010.ckpt is intact (0.5 MiB; the next one needs as much): free "
        "space, then run the same command to resume from it"
    ) in err
    assert "unexpected pos" not in err and "Traceback" not in err
    assert (ckdir / "latest").read_text() == "step-00000010.ckpt\n"
    assert verify(ckdir / "step-00000010.ckpt") is None
    assert not [p for p in ckdir.iterdir() if p.name.endswith(".tmp")]  # the partial write is gone

    subprocess.run(["mount", "-o", "remount,size=4m", str(ckdir)], check=True)  # room again
    resumed = run_inprocess(*SMALL, *big, job_dir=job)
    assert (resumed.exit_code, resumed.result["resumed_from_step"]) == (0, 10)
    assert (job / MODEL_FILE).read_bytes() == (straight.job_dir / MODEL_FILE).read_bytes()
