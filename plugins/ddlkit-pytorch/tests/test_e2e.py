"""End to end through the real CLI with the real PyTorch plugin: train, check the job
directory, and prove that an interrupted-then-resumed run ends with the same weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.testing import RESULT_KEYS

torch = pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

pytestmark = pytest.mark.slow

# tiny but real: ResNet-18 at 32 px, 12 steps per epoch, deterministic kernels, one thread
COMMON = [
    "framework=pytorch",
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=192",
    "data.val_length=32",
    "trainer.batch_size=16",
    "trainer.epochs=2",
    "trainer.log_every=2",
    "trainer.warmup_steps=2",
    "trainer.deterministic=true",
    "framework.num_threads=1",
]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """As in the core's suite, where these tests lived: environment restored (and leaks
    reported), a working directory of its own, fresh plugin and Hydra state."""


def ddlkit(job_dir: Path, *overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *COMMON, *overrides, f"hydra.run.dir={job_dir}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("e2e")
    straight, resumed = root / "straight", root / "resumed"
    outcomes = [
        ddlkit(straight, cwd=root),
        ddlkit(resumed, "trainer.max_steps=5", cwd=root),  # "interrupted" mid-epoch 1
        ddlkit(resumed, cwd=root),  # the same command again, same directory: continues
    ]
    for proc in outcomes:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"straight": straight, "resumed": resumed, "stdout": outcomes[0].stdout, "resume_stdout": outcomes[2].stdout}


def test_job_directory_holds_config_metrics_checkpoint_result(runs):
    job = runs["straight"]
    for name in (
        "config.yaml",
        "overrides.yaml",
        "environment.json",
        "job.json",
        "metrics.jsonl",
        "result.json",
        "model.pt",
        "rank-0.log",
        "checkpoints/latest",
    ):
        assert (job / name).is_file(), name
    assert (job / "checkpoints" / (job / "checkpoints/latest").read_text().strip()).is_file()
    env = json.loads((job / "environment.json").read_text())
    assert env["packages"]["torch"].startswith("2.")
    assert "trainer.epochs=2" in (job / "overrides.yaml").read_text()


def test_result_json_reports_the_run(runs):
    result = json.loads((runs["straight"] / "result.json").read_text())
    assert RESULT_KEYS <= result.keys()
    assert result["framework"] == "pytorch" and result["model"] == "resnet18"
    assert result["steps"] == 24 and result["epochs"] == 2
    assert result["world_size"] == 1 and result["global_batch_size"] == 16
    assert result["images_per_sec"] > 0
    # the rank process's peak resident set (issue 41, item 5): torch and the model, well over 100 MiB
    assert result["peak_memory"] == "rss" and result["peak_memory_mib"] > 100, result["peak_memory_mib"]
    # warm-up excluded: 24 steps minus 2 warm-up, minus the first step after each validation pause
    assert result["measured_steps"] in range(19, 23)
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0
    assert result["final_loss"] < 2.3  # below chance for 10 classes
    # synthetic images carry their label (a class pattern plus noise): validation far above chance (0.1)
    assert result["top1"] > 0.5


def test_metrics_file_has_a_line_per_logging_step_and_validation(runs):
    lines = [json.loads(ln) for ln in (runs["straight"] / "metrics.jsonl").read_text().splitlines()]
    train = [ln for ln in lines if ln["split"] == "train"]
    val = [ln for ln in lines if ln["split"] == "val"]
    assert [ln["step"] for ln in train] == list(range(2, 25, 2))
    assert len(val) == 2 and {"val_loss", "val_top1", "val_top5"} <= val[0].keys()
    # the learning rate warms up linearly (Goyal et al.): 16/256 * 0.1 peak over 1 epoch = 12 steps
    assert train[0]["lr"] == pytest.approx(0.1 * 16 / 256 * 2 / 12)
    assert train[-1]["lr"] == pytest.approx(0.1 * 16 / 256)


def test_resumed_run_ends_with_the_same_weights(runs):
    a = torch.load(runs["straight"] / "model.pt", weights_only=True)
    b = torch.load(runs["resumed"] / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"weights differ after resume: {different[:5]}"
    result = json.loads((runs["resumed"] / "result.json").read_text())
    assert result["resumed_from_step"] == 5 and result["steps"] == 24
    assert "resumed from" in runs["resume_stdout"]
    # this run's lines only, not the interrupted attempt's too (issue 22, item 8): rank-0.log holds both
    assert runs["resume_stdout"].count("first step done") == 1, runs["resume_stdout"]
    assert (runs["resumed"] / "rank-0.log").read_text().count("first step done") == 2


def test_model_weights_use_torchvision_keys(runs):
    state = torch.load(runs["straight"] / "model.pt", weights_only=True)
    assert "layer4.1.bn2.running_var" in state and state["fc.weight"].shape == (10, 512)


def test_a_pytorch_run_never_imports_tensorflow(tmp_path):
    code = (
        "import sys, runpy; sys.argv=['ddlkit','--cfg','job']; "
        "import ddlkit.launch.cli as c\ntry: c.main(['--cfg','job'])\n"
        "finally: print('TF' if 'tensorflow' in sys.modules else 'NOTF', "
        "'TORCH' if 'torch' in sys.modules else 'NOTORCH')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "framework:" in proc.stdout and "name: pytorch" in proc.stdout
    assert proc.stdout.strip().endswith("NOTF NOTORCH")


def test_a_batch_of_one_with_batchnorm_is_refused_in_one_line(tmp_path):
    """Issue 17, item 14: torch refused it at the ResNet's last BatchNorm with a traceback; now
    the rank stops before training with what to change, and the job exits 2."""
    proc = ddlkit(tmp_path / "job", "trainer.batch_size=1", "data.length=8", "data.val_length=4", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trainer.batch_size=1 is too small for this model: its BatchNorm layers need at least 2 samples" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "job" / "metrics.jsonl").exists()
