"""framework=keras end to end through the real ``ddlkit`` CLI: result.json and metrics.jsonl as
PyTorch writes them, atomic checkpoints, and resumes (mid-epoch, and after an epoch's last step
but before its validation) that end with the weights of an uninterrupted run. TensorFlow takes
seconds to start, so the runs are shared per module."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ddlkit.testing import RESULT_KEYS
from ddlkit.testing.core import latest_checkpoint, verify

pytestmark = [
    pytest.mark.slow,
    # find_spec, not importorskip: the runs are subprocesses, this process needs no TensorFlow
    pytest.mark.skipif(find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
]

# ResNet-18 at 32 px, 6 steps per epoch, 2 epochs; deterministic kernels so runs compare bit for bit
COMMON = [
    "framework=keras",
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=96",
    "data.val_length=32",
    "trainer.batch_size=16",
    "trainer.epochs=2",
    "trainer.log_every=2",
    "trainer.warmup_steps=2",
    "trainer.deterministic=true",
]
TOTAL_STEPS = 12


def ddlkit(job_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit", *COMMON, *overrides, f"hydra.run.dir={job_dir}"],
        cwd=job_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def metrics(job: Path, split: str) -> list[dict[str, Any]]:
    lines = [json.loads(ln) for ln in (job / "metrics.jsonl").read_text().splitlines()]
    return [ln for ln in lines if ln["split"] == split]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("keras-e2e")
    straight, resumed, boundary = root / "straight", root / "resumed", root / "boundary"
    ddlkit(straight)
    # "interrupted" mid-epoch 1; logging every step shows each batch's own loss
    ddlkit(resumed, "trainer.max_steps=3", "trainer.log_every=1")
    resume = ddlkit(resumed)  # the same command in the same directory continues
    # a checkpoint as SIGTERM leaves it after epoch 1's last step, before that epoch's validation:
    # the step-6 state of the straight run, with its progress counters set back accordingly
    state = arrays(straight / "checkpoints" / "step-00000006.ckpt")
    meta = json.loads(str(state["meta"]))
    meta["state"] = {"epoch": 0, "step": 6, "batch": 6}
    edited = root / "after-last-step.ckpt"
    with open(edited, "wb") as f:
        np.savez(f, **{**state, "meta": np.array(json.dumps(meta))})
    ddlkit(boundary, f"trainer.resume={edited}")
    return {"straight": straight, "resumed": resumed, "boundary": boundary, "resume_text": resume.stdout}


def test_result_json_has_the_pytorch_fields(runs: dict) -> None:
    result = json.loads((runs["straight"] / "result.json").read_text())
    assert RESULT_KEYS <= result.keys()
    assert result["status"] == "completed" and result["framework"] == "keras" and result["model"] == "resnet18"
    assert result["steps"] == TOTAL_STEPS and result["epochs"] == 2 and result["steps_per_epoch"] == 6
    assert result["images_per_sec"] > 0 and result["measured_steps"] > 0
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0
    assert result["final_loss"] < 2.3  # below chance for 10 classes: the model learned the batch
    assert (runs["straight"] / "model.keras").is_file()


def test_metrics_have_a_train_line_per_logging_step_and_a_val_line_per_epoch(runs: dict) -> None:
    train, val = metrics(runs["straight"], "train"), metrics(runs["straight"], "val")
    assert [ln["step"] for ln in train] == list(range(2, TOTAL_STEPS + 1, 2))
    assert {"loss", "lr", "images_per_sec", "epoch"} <= train[0].keys()
    assert [ln["step"] for ln in val] == [6, 12]
    assert {"val_loss", "val_top1", "val_top5"} <= val[0].keys()
    # the shared schedule, set on the optimizer before each batch: warm-up over 1 epoch
    assert train[0]["lr"] == pytest.approx(0.1 * 16 / 256 * 2 / 6)
    assert train[-1]["lr"] == pytest.approx(0.1 * 16 / 256)


def test_the_logged_loss_is_the_batch_loss_not_keras_running_mean(runs: dict) -> None:
    every_step = {ln["step"]: ln["loss"] for ln in metrics(runs["resumed"], "train") if ln["step"] <= 3}
    every_other = {ln["step"]: ln["loss"] for ln in metrics(runs["straight"], "train")}
    assert sorted(every_step) == [1, 2, 3]
    # logged every 2nd step, step 2's loss is still step 2's alone, not the mean of steps 1 and 2
    assert every_other[2] == every_step[2] != pytest.approx((every_step[1] + every_step[2]) / 2)


def test_checkpoints_are_complete_and_no_partial_write_remains(runs: dict) -> None:
    for job in (runs["straight"], runs["resumed"], runs["boundary"]):
        entries = sorted(p.name for p in (job / "checkpoints").iterdir())
        assert entries == [
            "latest",
            "step-00000006.ckpt",
            "step-00000006.ckpt.manifest.json",
            "step-00000012.ckpt",
            "step-00000012.ckpt.manifest.json",
        ], entries
        assert verify(job / "checkpoints" / "step-00000012.ckpt") is None
        meta = json.loads(str(arrays(latest_checkpoint(job))["meta"]))
        assert meta["state"] == {"epoch": 2, "step": TOTAL_STEPS, "batch": 0}
        assert meta["framework"] == "keras"


@pytest.mark.parametrize(("job", "resumed_from"), [("resumed", 3), ("boundary", 6)])
def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(runs: dict, job: str, resumed_from: int) -> None:
    result = json.loads((runs[job] / "result.json").read_text())
    assert result["resumed_from_step"] == resumed_from and result["steps"] == TOTAL_STEPS and result["epochs"] == 2
    a, b = arrays(latest_checkpoint(runs["straight"])), arrays(latest_checkpoint(runs[job]))
    assert a.keys() == b.keys()
    different = [k for k in a if k != "meta" and not np.array_equal(a[k], b[k])]
    assert not different, f"state differs after resume: {different[:5]}"


def test_resuming_mid_epoch_fits_only_the_batches_not_yet_seen(runs: dict) -> None:
    assert "resumed from" in runs["resume_text"]
    train = [ln["step"] for ln in metrics(runs["resumed"], "train")]
    assert train == [1, 2, 3, 4, 6, 8, 10, 12]
    assert [ln["step"] for ln in metrics(runs["resumed"], "val")] == [3, 6, 12]


def test_resuming_after_an_epochs_last_step_validates_it_then_goes_on(runs: dict) -> None:
    val = metrics(runs["boundary"], "val")
    straight_val = metrics(runs["straight"], "val")
    assert [ln["step"] for ln in val] == [6, 12]
    assert val[0]["val_loss"] == straight_val[0]["val_loss"]
    assert [ln["step"] for ln in metrics(runs["boundary"], "train")] == [8, 10, 12]
