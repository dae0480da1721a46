"""logger=console's lines (issue 22, item 8): the epoch a step belongs to, a rate or a dash, a
validation cut short by max_steps named by its step, and a task without images or classes said so."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from ddlkit.builtin.console_logger import ConsoleLogger, ConsoleLoggerConfig
from ddlkit.custom import LAUNCH_DIR_ENV
from ddlkit.testing import make_run


def lines(run, *calls) -> list[str]:
    out = io.StringIO()
    logger = ConsoleLogger(ConsoleLoggerConfig(), stream=out)
    logger.start(run)
    for step, metrics, split in calls:
        logger.log_metrics(step, metrics, split=split)
    return out.getvalue().splitlines()


def test_progress_lines_name_the_epoch_of_their_step(ddlkit_pm, tmp_path: Path) -> None:
    # 10 steps per epoch, 2 epochs, max_steps 15
    run = make_run(ddlkit_pm, tmp_path, "data.length=320", "data.num_classes=4", "trainer.max_steps=15")
    header, *rest = lines(
        run,
        (10, {"loss": 1.0, "lr": 0.1, "epoch": 1.0}, "train"),
        (11, {"loss": 1.0, "lr": 0.1, "epoch": 1.1, "images_per_sec": 50.0}, "train"),
        (15, {"epoch": 1.5, "val_loss": 2.0}, "val"),
    )
    assert "on synthetic data (64px images, 4 classes)" in header
    assert rest[0].startswith("train epoch 1/2 step 10/15 loss 1.0000 lr 0.100000 img/s - eta ")
    assert rest[1].startswith("train epoch 2/2 step 11/15 loss 1.0000 lr 0.100000 img/s 50.0 eta ")
    assert rest[2] == "step 15/15 validation (in epoch 2/2): val_loss 2.0000"


@pytest.mark.parametrize(("steps", "shown"), [(6, "0.60 of 2"), (10, "1 of 2"), (20, "2"), (None, "0")])
def test_the_summary_counts_the_epochs_trained_not_only_the_completed_ones(
    ddlkit_pm, tmp_path: Path, steps, shown: str
) -> None:
    """A run stopped in its first epoch said "epochs 0" after its "epoch 1/2" lines (issue 37, item 15)."""
    run = make_run(ddlkit_pm, tmp_path, "data.length=320", "data.num_classes=4")
    out = io.StringIO()
    logger = ConsoleLogger(ConsoleLoggerConfig(), stream=out)
    logger.start(run)
    logger.finish("stopped", {"epochs": (steps or 0) // 10, "steps": steps, "steps_per_epoch": 10})
    (row,) = [line for line in out.getvalue().splitlines() if " epochs " in line]
    assert row.split("│")[2].strip() == shown


def test_a_task_without_images_or_classes_counts_samples(
    ddlkit_pm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "regress.py").write_text(
        "import numpy as np\n\ndef xy(split):\n    return np.zeros((64, 3), np.float32), np.zeros(64, np.float32)\n"
    )
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.delitem(sys.modules, "regress", raising=False)
    run = make_run(ddlkit_pm, tmp_path / "job", "data=custom", "data.target=regress:xy", "trainer.batch_size=8")
    header, progress = lines(run, (2, {"loss": 1.0, "lr": 0.1, "epoch": 0.25, "images_per_sec": 9.0}, "train"))
    assert "on custom data (64 samples) |" in header
    assert " samples/s 9.0 " in progress
    sys.modules.pop("regress", None)


def test_the_launchers_bar_reads_the_lines_the_logger_writes(ddlkit_pm, tmp_path: Path) -> None:
    """The two sides of rank 0's progress line (jobdir.PROGRESS_LINE): the console logger on the rank
    writes it, the launcher's bar reads it; any other line passes through as it is."""
    from ddlkit.launch.progress import ProgressRenderer

    run = make_run(ddlkit_pm, tmp_path, "data.length=320", "data.num_classes=4", "trainer.max_steps=15")
    _, progress = lines(run, (11, {"loss": 0.5, "lr": 0.1, "epoch": 1.1, "images_per_sec": 50.0}, "train"))
    out = io.StringIO()
    with ProgressRenderer(out) as renderer:
        renderer.feed(f"hello from rank 0\n{progress}\n")
        task = renderer.progress.tasks[0]
        assert (task.completed, task.total) == (11, 15)
        assert task.fields == {
            "epoch": "2/2",
            "loss": "0.5000",
            "ips": "50.0",
            "unit": "img",
            "eta": progress.rsplit(" ", 1)[1],
        }
    assert "hello from rank 0" in out.getvalue() and "train epoch" not in out.getvalue()
