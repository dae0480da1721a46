"""logger=tensorboard: event files read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import ddlkit
import ddlkit_tensorboard.plugin
from ddlkit.testing import WorkerOutcome, add_plugin
from ddlkit.testing.core import DdlkitPluginManager

# 10 steps per epoch, 2 epochs, a log line every 2 steps
COMMON = (
    "logger=[jsonl,tensorboard]",
    "data.length=320",
    "data.val_length=64",
    "data.num_classes=10",
    "trainer.log_every=2",
)


@pytest.fixture
def run(ddlkit_pm: DdlkitPluginManager, run_inprocess: Callable[..., WorkerOutcome]) -> Callable[..., WorkerOutcome]:
    add_plugin(ddlkit_pm, ddlkit_tensorboard.plugin, name="tensorboard", distribution="ddlkit-tensorboard")
    return run_inprocess


@pytest.fixture
def scalars(event_accumulator: type) -> Callable[[Path], dict[str, list[tuple[int, float]]]]:
    """``scalars(logdir)``: {tag: [(step, value), ...]} as TensorBoard reads them."""

    def read(logdir: Path) -> dict[str, list[tuple[int, float]]]:
        acc = event_accumulator(str(logdir))
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    return read


def pairs(values: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Values rounded as TensorBoard stores them (float32), for exact comparison."""
    return [(step, round(value, 4)) for step, value in values]


Scalars = Callable[[Path], dict[str, list[tuple[int, float]]]]


# TensorBoard's reader loads TensorFlow (seconds, once per session)
@pytest.mark.slow
def test_scalars_per_step_and_per_epoch(run: Callable[..., WorkerOutcome], scalars: Scalars) -> None:
    out = run(*COMMON)
    assert out.exit_code == 0
    steps = scalars(out.job_dir / "tensorboard")
    assert sorted(steps) == [
        "train/epoch",
        "train/images_per_sec",
        "train/loss",
        "train/lr",
        "val/val_loss",
        "val/val_top1",
        "val/val_top5",
    ]
    train = [m for m in out.metrics if m["split"] == "train"]
    assert pairs(steps["train/loss"]) == pairs([(m["step"], m["loss"]) for m in train])
    assert [s for s, _ in steps["train/loss"]] == list(range(2, 21, 2))
    assert [s for s, _ in steps["val/val_top1"]] == [10, 20]
    epochs = scalars(out.job_dir / "tensorboard" / "epoch")
    assert sorted(epochs) == ["epoch/val_loss", "epoch/val_top1", "epoch/val_top5"]
    val = [m for m in out.metrics if m["split"] == "val"]
    assert pairs(epochs["epoch/val_loss"]) == pairs([(1, val[0]["val_loss"]), (2, val[1]["val_loss"])])


@pytest.mark.slow
def test_a_resumed_run_replaces_what_the_interrupted_attempt_logged_after_its_checkpoint(
    run: Callable[..., WorkerOutcome], scalars: Scalars, tmp_path: Path
) -> None:
    job_dir = tmp_path / "job"
    # a checkpoint at step 6, then step 8 logged, then a failure at step 9
    failed = run(*COMMON, "trainer.checkpoint_every=6", "framework.fail_at_step=9", job_dir=job_dir)
    assert failed.exit_code == 1
    resumed = run(*COMMON, "trainer.checkpoint_every=6", job_dir=job_dir)
    assert resumed.exit_code == 0 and resumed.result["resumed_from_step"] == 6
    steps = scalars(job_dir / "tensorboard")
    # each step once, with the values of the attempt that completed
    assert [s for s, _ in steps["train/loss"]] == list(range(2, 21, 2))
    assert pairs(steps["train/loss"]) == pairs(
        [(m["step"], m["loss"]) for m in resumed.metrics if m["split"] == "train"]
    )
    assert [s for s, _ in scalars(job_dir / "tensorboard" / "epoch")["epoch/val_top1"]] == [1, 2]


def test_the_logger_imports_neither_tensorflow_nor_torch(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom pathlib import Path\nfrom ddlkit_tensorboard.logger import EventFile\n"
        "f = EventFile(Path('tb'))\nf.scalars(1, {'a': 1.0})\nf.close()\n"
        "print(sorted(m for m in ('tensorflow', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1


def test_a_bad_subdir_is_a_config_error(run: Callable[..., WorkerOutcome]) -> None:
    with pytest.raises(ddlkit.ConfigError, match="logger.tensorboard.subdir=/abs is invalid"):
        run("logger=[tensorboard]", "logger.tensorboard.subdir=/abs")
