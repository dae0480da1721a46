"""What Lightning users expect of a trainer (issue 22, item 10), in the rules every framework shares
(:class:`ddlkit.Run`, run here by the fake framework): gradient accumulation counts optimizer steps,
early stopping, the best checkpoint, callbacks from a config line, and their checks at launch.
The maths of clipping and accumulation is each framework plugin's, tested there against
:func:`ddlkit.testing.optim.linear_step`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ddlkit import ConfigError, monitor
from ddlkit.checkpoint import BEST, read_manifest, verify
from ddlkit.launch.validate import validate
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.registry import Registry
from ddlkit.testing import RunFactory, add_plugin, compose, fakes, with_default_framework
from ddlkit.testing.fakes import MODEL_FILE

SMALL = ("data.length=320", "data.val_length=64", "data.num_classes=10", "trainer.log_every=5")


def checked(pm: DdlkitPluginManager, *overrides: str) -> dict:
    add_plugin(pm, fakes, name=fakes.__name__)
    registry = Registry.collect(pm)
    return validate(compose(registry, with_default_framework(overrides)), registry, pm)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.accumulate_batches=0"],
            "trainer.accumulate_batches=0 is invalid: it must be a positive integer "
            "(micro-batches per optimizer step; 1 = none accumulated).",
        ),
        (
            ["trainer.clip_grad_norm=-1"],
            "trainer.clip_grad_norm=-1.0 is invalid: it must be null, 0 (no clipping) or a positive gradient norm.",
        ),
        (
            ["trainer.early_stopping.patience=-1"],
            "trainer.early_stopping.patience=-1 is invalid: it must be >= 0 "
            "(validations in a row without an improvement before the run stops).",
        ),
        (
            ["trainer.early_stopping.min_delta=-0.1"],
            "trainer.early_stopping.min_delta=-0.1 is invalid: it must be >= 0.",
        ),
        (
            ["trainer.early_stopping.monitor=val_acc"],
            "trainer.early_stopping.monitor=val_acc is not a validation metric "
            "of this run: choose one of val_loss, val_top1, val_top5.",
        ),
        (
            ["trainer.best_checkpoint.monitor=val_top5", "data.num_classes=4"],
            "trainer.best_checkpoint.monitor=val_top5 is not a validation metric of this run: choose one of val_loss, "
            "val_top1.",
        ),
        (
            ["trainer.best_checkpoint.monitor=val_loss", "trainer.best_checkpoint.mode=down"],
            "trainer.best_checkpoint.mode=down is invalid: choose one of auto, min, max.",
        ),
        (
            ["trainer.early_stopping.monitor=val_loss", "trainer.validate=false"],
            "trainer.early_stopping.monitor=val_loss watches validation, but trainer.validate=false: set "
            "trainer.validate=true, or trainer.early_stopping.monitor=null.",
        ),
        (
            ["trainer.accumulate_batches=4", "trainer.batch_size=32", "data.length=100"],
            "data has 100 training images, fewer than one global batch of 128 (trainer.batch_size=32 x 1 ranks x 4 "
            "micro-batches). Lower trainer.batch_size or trainer.accumulate_batches, or raise data.length.",
        ),
        (
            ["trainer.callbacks=[ddlkit.testing.no_such_module:Cb]"],
            "trainer.callbacks[0]=ddlkit.testing.no_such_module:Cb does not import (ModuleNotFoundError: No module "
            "named "
            "'ddlkit.testing.no_such_module'). Fix the import path, or make the module importable where the ranks "
            "run: an "
            "installed package, or a module in the directory ddlkit is started in.",
        ),
        (
            ["trainer.callbacks=[ddlkit.testing.optim:linear_data]"],
            "trainer.callbacks[0]=ddlkit.testing.optim:linear_data has none of the callback methods on_run_start, "
            "on_step_end, on_epoch_end, on_checkpoint_saved, on_run_end: define one or more of them (see "
            "ddlkit.callbacks).",
        ),
    ],
)
def test_bad_trainer_options_are_config_errors(
    ddlkit_pm: DdlkitPluginManager, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        checked(ddlkit_pm, *overrides)
    assert str(info.value) == message


def test_a_custom_metric_needs_a_mode() -> None:
    with pytest.raises(ConfigError) as info:
        monitor.direction("early_stopping", "val_mae", "auto")
    assert str(info.value) == (
        "trainer.early_stopping.mode=auto cannot tell whether val_mae is better up or down: set "
        "trainer.early_stopping.mode=min or trainer.early_stopping.mode=max."
    )
    assert monitor.direction("early_stopping", "val_mae", "min") == "min"


def test_an_unknown_monitor_is_one_line_exit_2_at_the_launcher(run_factory: RunFactory) -> None:
    out = run_factory(*SMALL, "trainer.early_stopping.monitor=val_accuracy").assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: trainer.early_stopping.monitor=val_accuracy is not a validation metric of "
        "this run: choose one of val_loss, val_top1, val_top5.\n"
    )
    assert not list(run_factory.base_dir.glob("run-1/checkpoints"))


def test_accumulation_counts_optimizer_steps_of_the_global_batch(run_inprocess, capsys) -> None:
    # 320 images, 8 per micro-batch x 4 micro-batches = 32 per step: 10 optimizer steps per epoch
    accumulated = run_inprocess(*SMALL, "trainer.batch_size=8", "trainer.accumulate_batches=4", "trainer.epochs=2")
    assert "| 1 rank(s) x batch 8 x 4 accumulated = 32 | 20 steps (10/epoch) |" in capsys.readouterr().out
    plain = run_inprocess(*SMALL, "trainer.batch_size=32", "trainer.epochs=2")
    result = accumulated.result
    assert (result["global_batch_size"], result["steps_per_epoch"], result["steps"]) == (32, 10, 20)
    assert result["accumulate_batches"] == 4 and result["peak_lr"] == plain.result["peak_lr"]
    assert [m["step"] for m in accumulated.metrics if m.get("split") == "train"] == [5, 10, 15, 20]
    # the fake framework's step is the mean over its micro-batches: the same weights as one big batch
    np.testing.assert_allclose(
        np.load(accumulated.job_dir / MODEL_FILE), np.load(plain.job_dir / MODEL_FILE), rtol=1e-12
    )


def test_a_resumed_accumulating_run_ends_like_an_uninterrupted_one(run_inprocess, tmp_path: Path) -> None:
    args = (*SMALL, "trainer.batch_size=8", "trainer.accumulate_batches=2", "trainer.epochs=2")
    straight = run_inprocess(*args)
    job_dir = tmp_path / "resumed"
    assert run_inprocess(*args, "trainer.max_steps=25", job_dir=job_dir).exit_code == 0  # mid-epoch 2
    resumed = run_inprocess(*args, job_dir=job_dir)
    assert resumed.result["resumed_from_step"] == 25 and resumed.result["steps"] == 40
    np.testing.assert_array_equal(np.load(job_dir / MODEL_FILE), np.load(straight.job_dir / MODEL_FILE))


def test_early_stopping_stops_all_ranks_at_the_epoch_without_improvement(run_inprocess, capsys) -> None:
    # min_delta so large that no epoch after the first counts as an improvement; patience 2: stop at epoch 3
    out = run_inprocess(
        *SMALL,
        "trainer.epochs=6",
        "trainer.early_stopping.monitor=val_loss",
        "trainer.early_stopping.patience=2",
        "trainer.early_stopping.min_delta=100",
    )
    assert out.exit_code == 0 and out.status == "completed"
    result = out.result
    assert (result["epochs"], result["steps"]) == (3, 30)
    reason = result["stopped_early"]["reason"]
    assert reason.startswith("val_loss did not improve by more than 100 for 2 validation(s) (patience 2; best ")
    assert reason.endswith(" at epoch 1, step 10)")
    assert result["stopped_early"] | {"reason": None} == {"monitor": "val_loss", "reason": None, "epoch": 3, "step": 30}
    lines = [line for line in capsys.readouterr().out.splitlines() if "stopping early" in line]
    assert lines == [f"ddlkit: stopping early after epoch 3 (step 30): {reason}"]
    # the run is over: a re-run of the job does not train on
    again = run_inprocess(
        *SMALL,
        "trainer.epochs=6",
        "trainer.early_stopping.monitor=val_loss",
        "trainer.early_stopping.patience=2",
        "trainer.early_stopping.min_delta=100",
        job_dir=out.job_dir,
    )
    assert (again.result["steps"], again.result["resumed_from_step"]) == (30, 30)


def test_a_run_that_keeps_improving_is_not_stopped(run_inprocess) -> None:
    out = run_inprocess(*SMALL, "trainer.epochs=2", "trainer.early_stopping.monitor=val_loss")
    assert out.result["stopped_early"] is None and out.result["epochs"] == 2


def test_the_best_checkpoint_is_kept_through_the_rotation(run_inprocess) -> None:
    # top-1 can only get worse from epoch 1 on when mode=min asks for the lowest: epoch 1 stays the best
    out = run_inprocess(
        *SMALL,
        "trainer.epochs=3",
        "trainer.keep_checkpoints=1",
        "trainer.best_checkpoint.monitor=val_loss",
        "trainer.best_checkpoint.mode=max",
    )
    best = out.job_dir / "checkpoints" / BEST
    steps = sorted(p.name for p in (out.job_dir / "checkpoints").glob("step-*.ckpt"))
    assert steps == ["step-00000030.ckpt"]  # the rotation kept one step checkpoint, and best.ckpt besides
    record = out.result["best_checkpoint"]
    losses = [m["val_loss"] for m in out.metrics if m.get("split") == "val"]
    epoch = losses.index(max(losses)) + 1
    assert record == {
        "monitor": "val_loss",
        "mode": "max",
        "value": max(losses),
        "step": 10 * epoch,
        "epoch": epoch,
        "path": "checkpoints/best.ckpt",
    }
    assert verify(best) is None and read_manifest(best)["checkpoint"] == BEST
    with np.load(best) as ckpt:
        assert json.loads(str(ckpt["meta"]))["state"]["step"] == record["step"]


CALLBACKS = textwrap.dedent("""\
    import json

    class Recorder:
        def __init__(self):
            self.seen = []

        def on_run_start(self, run):
            self.seen.append(["run_start", run.state.step])

        def on_step_end(self, step):  # a subset of the hook's arguments
            self.seen.append(["step_end", step])

        def on_epoch_end(self, run, epoch, metrics):
            self.seen.append(["epoch_end", epoch, sorted(metrics)])

        def on_checkpoint_saved(self, **kwargs):
            self.seen.append(["checkpoint_saved", kwargs["step"]])

        def on_run_end(self, run, status, result):
            self.seen.append(["run_end", status, result["steps"]])
            (run.job_dir / "callbacks.json").write_text(json.dumps(self.seen))

    class Broken:
        def __init__(self):
            raise ValueError("no config")

        def on_run_end(self):
            pass
    """)


def test_callbacks_from_a_config_line_see_the_runs_hooks(run_factory: RunFactory) -> None:
    (run_factory.base_dir / "my_callbacks.py").write_text(CALLBACKS)
    out = run_factory(*SMALL, "trainer.epochs=1", "trainer.callbacks=[my_callbacks:Recorder]").assert_success()
    seen = json.loads((out.job_dir / "callbacks.json").read_text())
    assert seen == [
        ["run_start", 0],
        ["step_end", 5],
        ["step_end", 10],
        ["epoch_end", 1, ["val_loss", "val_top1", "val_top5"]],
        ["checkpoint_saved", 10],
        ["run_end", "completed", 10],
    ]


def test_a_callback_that_fails_to_build_is_one_line(run_factory: RunFactory) -> None:
    (run_factory.base_dir / "my_callbacks.py").write_text(CALLBACKS)
    out = run_factory(*SMALL, "trainer.callbacks=[my_callbacks:Broken]").assert_returncode(2)
    assert "ConfigError: trainer.callbacks[0]=my_callbacks:Broken() raised ValueError: no config" in out.stderr
    assert "Traceback" not in out.stderr
