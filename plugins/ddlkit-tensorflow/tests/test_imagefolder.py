"""data=imagefolder through the TensorFlow plugin's tf.data pipeline (TensorFlow and Keras): the
per-pass epoch of ``loader.dataset``, resuming, corrupt files -- in the pipeline, and through the
CLI, where a corrupt file ends the job with one line and exit status 2 (issue 17, item 21).
Imports TensorFlow, hence slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ddlkit
from ddlkit import Shard
from ddlkit.images import CorruptImageError
from ddlkit.testing.core import ImageFolderConfig, ImageFolderData
from ddlkit.testing.images import ImageDataset, make_image_dataset

pytestmark = pytest.mark.slow
tf = pytest.importorskip("tensorflow")
tf_data = pytest.importorskip("ddlkit_tensorflow.data")
SIZE = 32


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """As in the core's suite, where these tests lived: environment restored (and leaks
    reported), a working directory of its own, fresh plugin and Hydra state."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    return make_image_dataset(
        tmp_path_factory.mktemp("imagenet") / "root",
        classes=3,
        train_per_class=8,
        val_per_class=3,
        odd_files=True,
        corrupt=True,
    )


def source(root: Path, **overrides: Any) -> ImageFolderData:
    return ImageFolderData(ImageFolderConfig(root=str(root), image_size=SIZE, **overrides))


def tf_pipeline(src: ImageFolderData, batch_size: int, seed: int = 0, **kw: Any) -> Any:
    return tf_data.tf_loader(src.loader("train", batch_size=batch_size, shard=Shard(), seed=seed), **kw)


def test_odd_files_decode_and_batches_are_normalized(dataset: ImageDataset) -> None:
    loader = tf_pipeline(source(dataset.root, on_corrupt="skip"), 25)
    ((x, y),) = [(a.numpy(), b.numpy()) for a, b in loader.iter_epoch(0)]
    assert x.shape == (25, SIZE, SIZE, 3) and x.dtype == np.float32 and y.dtype == np.int64
    assert -3 < x.mean() < 3 and np.isfinite(x).all()
    assert loader.skipped == 1  # the corrupt file; grayscale, CMYK and PNG content decoded


def test_each_pass_over_dataset_serves_the_runs_current_epoch(dataset: ImageDataset) -> None:
    epoch = [2]
    loader = tf_pipeline(source(dataset.root, on_corrupt="skip"), 5, seed=1, pass_epoch=lambda: epoch[0])
    labels = [b.numpy() for _, b in loader.dataset]
    assert np.array_equal(np.concatenate(labels), np.concatenate([b.numpy() for _, b in loader.epoch(2)]))
    epoch[0] = 3
    assert np.array_equal(
        np.concatenate([b.numpy() for _, b in loader.dataset]), np.concatenate([b.numpy() for _, b in loader.epoch(3)])
    )
    assert int(loader.dataset.cardinality()) == len(loader)


def test_start_batch_skips_without_decoding_and_matches(dataset: ImageDataset) -> None:
    loader = tf_pipeline(source(dataset.root, on_corrupt="skip"), 5)
    full = [(x.numpy(), y.numpy()) for x, y in loader.epoch(1)]
    rest = [(x.numpy(), y.numpy()) for x, y in loader.epoch(1, 3)]
    assert len(rest) == len(full) - 3
    for (a, b), (c, d) in zip(rest, full[3:], strict=True):
        assert np.array_equal(a, c) and np.array_equal(b, d)


def test_corrupt_file_stops_the_pipeline_naming_it(dataset: ImageDataset) -> None:
    loader = tf_pipeline(source(dataset.root), 25)
    with pytest.raises(CorruptImageError) as info, tf_data.data_errors(loader):
        list(loader.iter_epoch(0))
    bad = str(dataset.root / dataset.corrupt[0])
    assert info.value.path == bad and "data.on_corrupt=skip" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # not TensorFlow's wrapper of it


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_a_corrupt_file_ends_the_job_with_one_line_and_status_2(
    dataset: ImageDataset, framework: str, tmp_path: Path
) -> None:
    pytest.importorskip(f"ddlkit_{framework}")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            f"framework={framework}",
            "data=imagefolder",
            f"data.root={dataset.root}",
            f"data.image_size={SIZE}",
            "trainer.batch_size=25",
            "trainer.epochs=1",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    bad = str(dataset.root / dataset.corrupt[0])
    log = (tmp_path / "job" / "rank-0.log").read_text()
    assert f"CorruptImageError: cannot decode image {bad}" in log
    assert "Traceback" not in log and "py_func" not in log and "Traceback" not in proc.stderr


def test_a_dataset_of_unreadable_files_is_an_error(tmp_path: Path, dataset: ImageDataset) -> None:
    root = tmp_path / "bad"
    for cls in dataset.classes:
        (root / "train" / cls).mkdir(parents=True)
        for i in range(8):
            (root / "train" / cls / f"{i}.JPEG").write_bytes(b"\xff\xd8\xff garbage")
    loader = tf_pipeline(source(root, on_corrupt="skip"), 4)
    with pytest.raises(ddlkit.RunError, match="in a row failed to decode"), tf_data.data_errors(loader):
        list(loader.iter_epoch(0))


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_decoder_gpu_is_refused_before_anything_runs(dataset: ImageDataset, framework: str, tmp_path: Path) -> None:
    """data.decoder=gpu is PyTorch's: tf.data decodes on the CPU, and must not do so silently."""
    pytest.importorskip(f"ddlkit_{framework}")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            f"framework={framework}",
            "data=imagefolder",
            f"data.root={dataset.root}",
            "data.decoder=gpu",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"ddlkit: error: data.decoder=gpu is PyTorch's (nvJPEG through torchvision); framework={framework} decodes "
        "its images in tf.data: use data.decoder=auto, or framework=pytorch."
    ]
    assert not (tmp_path / "job" / "job.json").exists()
