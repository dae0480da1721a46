"""data=imagefolder through tf.data (TensorFlow and Keras): the contract, the per-pass epoch of
``loader.dataset``, corrupt files. Imports TensorFlow, hence slow."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ddlkit import DataSource, Shard
from ddlkit.builtin.imagefolder import ImageFolderConfig, ImageFolderData
from ddlkit.testing.contracts import DataSourceContract
from ddlkit.testing.images import ImageDataset, make_image_dataset

pytestmark = pytest.mark.slow
tf = pytest.importorskip("tensorflow")
SIZE = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    return make_image_dataset(tmp_path_factory.mktemp("imagenet") / "root", classes=3, train_per_class=8,
                              val_per_class=3, odd_files=True, corrupt=True)


def source(root: Path, **overrides: Any) -> ImageFolderData:
    return ImageFolderData(ImageFolderConfig(root=str(root), image_size=SIZE, **overrides))


class TestImageFolderTensorflow(DataSourceContract):
    loader_format = "tensorflow"
    batch_size = 4

    @pytest.fixture
    def data_source(self, dataset: ImageDataset) -> DataSource:
        return source(dataset.root, on_corrupt="skip")

    def to_numpy(self, x: Any) -> Any:
        return x.numpy()


def test_odd_files_decode_and_batches_are_normalized(dataset: ImageDataset) -> None:
    loader = source(dataset.root, on_corrupt="skip").loader("tensorflow", "train", batch_size=25, shard=Shard(),
                                                            seed=0)
    (x, y), = [(a.numpy(), b.numpy()) for a, b in loader.iter_epoch(0)]
    assert x.shape == (25, SIZE, SIZE, 3) and x.dtype == np.float32 and y.dtype == np.int64
    assert -3 < x.mean() < 3 and np.isfinite(x).all()
    assert loader.skipped == 1  # the corrupt file; grayscale, CMYK and PNG content decoded


def test_each_pass_over_dataset_serves_the_runs_current_epoch(dataset: ImageDataset) -> None:
    src = source(dataset.root, on_corrupt="skip")
    run = SimpleNamespace(state=SimpleNamespace(epoch=2), dist=SimpleNamespace(local_size=1))
    src._run = run  # what prepare(run) records
    loader = src.loader("keras", "train", batch_size=5, shard=Shard(), seed=1)
    labels = [b.numpy() for _, b in loader.dataset]
    assert np.array_equal(np.concatenate(labels), np.concatenate([b.numpy() for _, b in loader.epoch(2)]))
    run.state.epoch = 3
    assert np.array_equal(np.concatenate([b.numpy() for _, b in loader.dataset]),
                          np.concatenate([b.numpy() for _, b in loader.epoch(3)]))
    assert int(loader.dataset.cardinality()) == len(loader)


def test_start_batch_skips_without_decoding_and_matches(dataset: ImageDataset) -> None:
    loader = source(dataset.root, on_corrupt="skip").loader("tensorflow", "train", batch_size=5, shard=Shard(), seed=0)
    full = [(x.numpy(), y.numpy()) for x, y in loader.epoch(1)]
    rest = [(x.numpy(), y.numpy()) for x, y in loader.epoch(1, 3)]
    assert len(rest) == len(full) - 3
    for (a, b), (c, d) in zip(rest, full[3:], strict=True):
        assert np.array_equal(a, c) and np.array_equal(b, d)


def test_corrupt_file_stops_the_pipeline_naming_it(dataset: ImageDataset, capfd: pytest.CaptureFixture[str]) -> None:
    loader = source(dataset.root).loader("tensorflow", "train", batch_size=25, shard=Shard(), seed=0)
    with pytest.raises(tf.errors.OpError) as info:
        list(loader.iter_epoch(0))
    bad = str(dataset.root / dataset.corrupt[0])
    assert bad in str(info.value)
    assert f"ddlkit: error: cannot decode image {bad}" in capfd.readouterr().err


def test_a_dataset_of_unreadable_files_is_an_error(tmp_path: Path, dataset: ImageDataset) -> None:
    root = tmp_path / "bad"
    for cls in dataset.classes:
        (root / "train" / cls).mkdir(parents=True)
        for i in range(8):
            (root / "train" / cls / f"{i}.JPEG").write_bytes(b"\xff\xd8\xff garbage")
    loader = source(root, on_corrupt="skip").loader("tensorflow", "train", batch_size=4, shard=Shard(), seed=0)
    with pytest.raises(tf.errors.OpError, match="in a row failed to decode"):
        list(loader.iter_epoch(0))
