"""Bring your own model, loss, metrics and data (issue 15), through the real CLI with the real
framework plugins: ``model=custom`` trains like a built-in model; the regression example in
``experiments/`` trains end to end in PyTorch and TensorFlow; bad input is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.plugins]  # framework=pytorch and framework=tensorflow

REPO = Path(__file__).resolve().parent.parent
SMALL = [
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=256",
    "data.val_length=64",
    "trainer.batch_size=32",
    "trainer.log_every=4",
    "framework.num_threads=1",
]

NETS = """
from torch import nn


def cnn(width=8, classes=10):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, classes))


def keras_model():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
"""


def ddlkit(cwd: Path, *overrides: str, job: str = "job") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *overrides, f"hydra.run.dir={cwd / job}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's directory: their module beside them, ddlkit started there."""
    (tmp_path / "mynets.py").write_text(textwrap.dedent(NETS))
    return tmp_path


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc.stderr


def test_a_custom_model_trains_checkpoints_and_resumes_like_a_builtin_one(project: Path) -> None:
    import torch

    common = ["model=custom", "model.target=mynets:cnn", "+model.kwargs.width=16", *SMALL, "trainer.epochs=2"]
    first = ddlkit(project, *common, "trainer.max_steps=10")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    resumed = ddlkit(project, *common)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    result = json.loads((project / "job" / "result.json").read_text())
    assert (result["model"], result["steps"], result["resumed_from_step"]) == ("custom", 16, 10)
    state = torch.load(project / "job" / "model.pt", weights_only=True)
    assert state["0.weight"].shape == (16, 3, 3, 3)  # built with model.kwargs.width=16
    config = (project / "job" / "config.yaml").read_text()
    assert "target: mynets:cnn" in config and "width: 16" in config


def test_an_import_path_that_does_not_import_is_one_line_naming_the_key(project: Path) -> None:
    err = one_error_line(ddlkit(project, "model=custom", "model.target=mynetz:cnn"))
    assert err == (
        "ddlkit: error: model.target=mynetz:cnn does not import (ModuleNotFoundError: No module named "
        "'mynetz'). Fix the import path, or make the module importable: an installed package, or a module "
        "in the directory ddlkit is started in.\n"
    )
    assert not (project / "job" / "job.json").exists()  # refused before anything ran


def test_a_module_that_fails_inside_shows_its_import_error(project: Path) -> None:
    (project / "broken.py").write_text("import missing_dependency_of_the_users_module\ndef cnn(): ...\n")
    err = one_error_line(ddlkit(project, "model=custom", "model.target=broken:cnn", *SMALL))
    assert (
        "ConfigError: model.target=broken:cnn does not import (ModuleNotFoundError: No module named "
        "'missing_dependency_of_the_users_module')"
    ) in err
    assert "resume with" not in err  # the same command would fail again


def test_a_keras_model_for_framework_pytorch_is_refused(project: Path) -> None:
    err = one_error_line(ddlkit(project, "model=custom", "model.target=mynets:keras_model", *SMALL))
    assert (
        "ConfigError: model.target=mynets:keras_model returned a keras.src.models.sequential.Sequential, not a "
        "torch.nn.Module: framework=pytorch trains torch.nn.Module models (a Keras model: use "
        "framework=keras or framework=tensorflow)."
    ) in err


def test_a_classifier_whose_output_does_not_match_the_classes_is_refused(project: Path) -> None:
    err = one_error_line(ddlkit(project, "model=custom", "model.target=mynets:cnn", "+model.kwargs.classes=7", *SMALL))
    assert (
        "ConfigError: model.target=mynets:cnn outputs shape (2, 7) for a batch of 2, but the data have 10 classes "
        "(data.num_classes): a classifier must output (batch, 10) logits."
    ) in err


@pytest.mark.parametrize(("framework", "epochs"), [("pytorch", 8), ("tensorflow", 4)])
def test_the_regression_experiment_trains_end_to_end(tmp_path: Path, framework: str, epochs: int) -> None:
    """experiments/regression.py: custom data, model, loss and metric; run from the repository root."""
    sys.path.insert(0, str(REPO))
    try:
        from experiments.regression import mean_baseline_mae
    finally:
        sys.path.remove(str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "+experiment=regression",
            f"framework={framework}",
            f"trainer.epochs={epochs}",
            "framework.num_threads=1",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()]
    val = [line for line in lines if line["split"] == "val"]
    assert len(val) == epochs and {"val_loss", "val_mae"} <= val[-1].keys() and "val_top1" not in val[-1]
    assert val[-1]["val_mae"] < 0.5 * mean_baseline_mae()  # the mean predicts at about 1.48
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["model"] == "custom" and result["data"] == "custom" and result["top1"] is None
