"""PyTorch training on data=imagefolder, in process: a run resumed mid-epoch ends where an
uninterrupted one does (the order and the crops depend on seed + epoch only), corrupt file
skipped. (TensorFlow and Keras pipelines: plugins/ddlkit-tensorflow/tests/test_imagefolder.py;
in-process Keras runs take a minute, too long for this test.) The core's data source itself:
tests/data_sources/test_imagefolder.py."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from ddlkit.testing import add_plugin
from ddlkit.testing.images import ImageDataset, make_image_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """As in the core's suite, where this test lived: environment restored (and leaks reported), a
    working directory of its own, fresh plugin and Hydra state."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    return make_image_dataset(
        tmp_path_factory.mktemp("imagenet") / "root",
        classes=3,
        train_per_class=6,
        val_per_class=2,
        odd_files=True,
        corrupt=True,
    )


@pytest.fixture(autouse=True)
def _inductor_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch writes its compile cache's location into the environment on first use; keep it per test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _train(run_inprocess: Any, ddlkit_pm: Any, framework: str, dataset: ImageDataset, job_dir: Path, *more: str) -> Any:
    add_plugin(ddlkit_pm, importlib.import_module(f"ddlkit_{framework}.plugin"), name=framework)
    out = run_inprocess(
        f"framework={framework}",
        "data=imagefolder",
        f"data.root={dataset.root}",
        "data.image_size=32",
        "data.on_corrupt=skip",
        "data.workers=0",
        "trainer.batch_size=4",
        "trainer.epochs=2",
        "trainer.log_every=1",
        "trainer.warmup_steps=1",
        "trainer.deterministic=true",
        *more,
        job_dir=job_dir,
    )
    assert (out.exit_code, out.status) == (0, "completed")
    return out


def test_a_run_resumed_mid_epoch_ends_like_an_uninterrupted_one(
    run_inprocess: Any, ddlkit_pm: Any, dataset: ImageDataset, tmp_path: Path
) -> None:
    framework = "pytorch"
    straight = _train(run_inprocess, ddlkit_pm, framework, dataset, tmp_path / "straight")
    steps = straight.run.steps_per_epoch
    assert straight.result["steps"] == 2 * steps == 2 * (19 // 4)  # 18 images + the corrupt one, batches of 4
    _train(run_inprocess, ddlkit_pm, framework, dataset, tmp_path / "resumed", f"trainer.max_steps={steps + 2}")
    resumed = _train(run_inprocess, ddlkit_pm, framework, dataset, tmp_path / "resumed")
    assert resumed.result["resumed_from_step"] == steps + 2
    assert resumed.result["final_loss"] == straight.result["final_loss"]
    assert (resumed.job_dir / "model.pt").read_bytes() == (straight.job_dir / "model.pt").read_bytes()
    assert 0 <= resumed.result["top1"] <= 1
