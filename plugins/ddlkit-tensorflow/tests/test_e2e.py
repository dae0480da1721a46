"""framework=tensorflow end to end through the real ``ddlkit`` CLI: the job directory, result.json,
metrics.jsonl, atomic checkpoints, and an interrupted-then-resumed run that ends with the weights
of an uninterrupted one. TensorFlow takes seconds to start, so the runs are shared per module."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
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
    "framework=tensorflow",
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
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *COMMON, *overrides, f"hydra.run.dir={job_dir}"],
        cwd=job_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tf-e2e")
    straight, resumed = root / "straight", root / "resumed"
    ok(ddlkit(straight))
    ok(ddlkit(resumed, "trainer.max_steps=4"))  # "interrupted" mid-epoch 1
    resume = ok(ddlkit(resumed))  # the same command in the same directory continues
    return {"straight": straight, "resumed": resumed, "resume_text": resume.stdout}


def arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def test_job_directory_holds_metrics_checkpoint_model_and_result(runs: dict) -> None:
    job = runs["straight"]
    for name in (
        "job.json",
        "config.yaml",
        "metrics.jsonl",
        "result.json",
        "model.keras",
        "rank-0.log",
        "checkpoints/latest",
    ):
        assert (job / name).is_file(), name
    # model.keras is Keras' zip: architecture + weights, no training state
    with zipfile.ZipFile(job / "model.keras") as z:
        assert {"config.json", "model.weights.h5"} <= set(z.namelist())
        assert b'"name": "layer4.1.bn2"' in z.read("config.json")


def test_result_json_has_the_pytorch_fields(runs: dict) -> None:
    result = json.loads((runs["straight"] / "result.json").read_text())
    assert RESULT_KEYS <= result.keys()
    assert result["status"] == "completed" and result["framework"] == "tensorflow" and result["model"] == "resnet18"
    assert result["steps"] == TOTAL_STEPS and result["epochs"] == 2 and result["steps_per_epoch"] == 6
    assert result["images_per_sec"] > 0 and result["measured_steps"] > 0
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0
    assert result["final_loss"] < 2.3  # below chance for 10 classes: the model learned the batch
    assert result["resumed_from_step"] is None


def test_metrics_have_a_train_line_per_logging_step_and_a_val_line_per_epoch(runs: dict) -> None:
    lines = [json.loads(ln) for ln in (runs["straight"] / "metrics.jsonl").read_text().splitlines()]
    train = [ln for ln in lines if ln["split"] == "train"]
    val = [ln for ln in lines if ln["split"] == "val"]
    assert [ln["step"] for ln in train] == list(range(2, TOTAL_STEPS + 1, 2))
    assert {"loss", "lr", "images_per_sec", "epoch"} <= train[0].keys()
    assert [ln["step"] for ln in val] == [6, 12]
    assert {"val_loss", "val_top1", "val_top5"} <= val[0].keys()
    # the shared schedule, set on the optimizer each step: warm-up over 1 epoch to 0.1 * 16 / 256
    assert train[0]["lr"] == pytest.approx(0.1 * 16 / 256 * 2 / 6)
    assert train[-1]["lr"] == pytest.approx(0.1 * 16 / 256)


def test_checkpoints_are_complete_and_no_partial_write_remains(runs: dict) -> None:
    for job in (runs["straight"], runs["resumed"]):
        entries = sorted(p.name for p in (job / "checkpoints").iterdir())
        # no temporary (.step-*.tmp) entry left; two checkpoints kept (trainer.keep_checkpoints=2)
        assert entries == [
            "latest",
            "step-00000006.ckpt",
            "step-00000006.ckpt.manifest.json",
            "step-00000012.ckpt",
            "step-00000012.ckpt.manifest.json",
        ], entries
        assert verify(job / "checkpoints" / "step-00000012.ckpt") is None
        saved = arrays(latest_checkpoint(job))
        meta = json.loads(str(saved["meta"]))
        assert meta["state"] == {"epoch": 2, "step": TOTAL_STEPS, "batch": 0}
        assert meta["framework"] == "tensorflow" and meta["model"] == "resnet18"
        assert "model/layer4.1.bn2/moving_variance" in saved
        assert any(k.startswith("optimizer/") for k in saved)


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(runs: dict) -> None:
    result = json.loads((runs["resumed"] / "result.json").read_text())
    assert result["resumed_from_step"] == 4 and result["steps"] == TOTAL_STEPS and result["epochs"] == 2
    assert "resumed from" in runs["resume_text"]
    a, b = arrays(latest_checkpoint(runs["straight"])), arrays(latest_checkpoint(runs["resumed"]))
    assert a.keys() == b.keys()
    # with trainer.deterministic=true TensorFlow's CPU kernels repeat bit for bit; momentum and
    # the optimizer's iteration count were restored too, or the optimizer variables would differ
    different = [k for k in a if k != "meta" and not np.array_equal(a[k], b[k])]
    assert not different, f"state differs after resume: {different[:5]}"


def test_resumed_metrics_continue_the_interrupted_ones(runs: dict) -> None:
    lines = [json.loads(ln) for ln in (runs["resumed"] / "metrics.jsonl").read_text().splitlines()]
    straight = [json.loads(ln) for ln in (runs["straight"] / "metrics.jsonl").read_text().splitlines()]
    train = {ln["step"]: ln["loss"] for ln in lines if ln["split"] == "train"}
    assert sorted(train) == [2, 4, 6, 8, 10, 12]
    assert train == {ln["step"]: ln["loss"] for ln in straight if ln["split"] == "train"}


def test_fp16_on_the_cpu_is_refused_before_the_job_starts(tmp_path: Path) -> None:
    proc = ddlkit(tmp_path / "fp16", "trainer.precision=fp16", "framework.device=cpu")
    assert proc.returncode == 2
    assert "trainer.precision=fp16 needs a GPU" in proc.stderr
    assert not (tmp_path / "fp16" / "job.json").exists()


def test_bf16_with_xla_trains(tmp_path: Path) -> None:
    job = tmp_path / "bf16"
    ok(
        ddlkit(
            job,
            "trainer.precision=bf16",
            "framework.xla=true",
            "trainer.max_steps=2",
            "trainer.validate=false",
            "trainer.save_model=false",
            "trainer.deterministic=false",
        )
    )
    result = json.loads((job / "result.json").read_text())
    assert result["precision"] == "bf16" and result["steps"] == 2
    assert np.isfinite(result["final_loss"])
