"""data=synthetic: the data-source contract, plus its pooled, learnable design."""

from __future__ import annotations

import numpy as np
import pytest

from ddlkit import DataInfo, DataSource, Shard
from ddlkit.builtin.synthetic_data import SyntheticData, SyntheticDataConfig
from ddlkit.testing.contracts import DataSourceContract


class TestSyntheticData(DataSourceContract):
    @pytest.fixture
    def data_source(self) -> DataSource:
        return SyntheticData(SyntheticDataConfig(image_size=8, num_classes=10, length=64, val_length=16))


def test_info_comes_from_the_config() -> None:
    source = SyntheticData(SyntheticDataConfig(image_size=224, num_classes=1000, length=1281167, val_length=50000))
    assert source.info == DataInfo(num_classes=1000, image_size=224, train_length=1281167, val_length=50000)


def test_batches_are_nhwc_float32_and_int64_labels() -> None:
    loader = SyntheticData(SyntheticDataConfig(image_size=8)).loader("train", batch_size=4, shard=Shard(), seed=0)
    images, labels = next(iter(loader.iter_epoch(0)))
    assert (images.shape, str(images.dtype)) == ((4, 8, 8, 3), "float32")
    assert (labels.shape, str(labels.dtype)) == ((4,), "int64")


def test_a_small_validation_split_still_has_one_batch() -> None:
    source = SyntheticData(SyntheticDataConfig(val_length=8))
    assert len(source.loader("val", batch_size=32, shard=Shard(), seed=0)) == 1


def test_the_0_1_signature_with_a_framework_first_is_refused() -> None:
    with pytest.raises(ValueError, match="split must be one of train, val, got 'numpy'"):
        SyntheticData(SyntheticDataConfig()).loader("numpy", batch_size=4, shard=Shard(), seed=0)


def test_images_carry_their_label() -> None:
    """The same class looks alike across splits and ranks, other classes do not: a nearest-class-mean
    classifier fitted on one rank's training batches labels another rank's validation images."""
    source = SyntheticData(SyntheticDataConfig(image_size=16, num_classes=5, length=400, val_length=100))
    train = source.loader("train", batch_size=20, shard=Shard(0, 2), seed=3)
    val = source.loader("val", batch_size=20, shard=Shard(1, 2), seed=3)
    xs, ys = zip(*train.iter_epoch(0), strict=True)
    x, y = np.concatenate(xs).reshape(200, -1), np.concatenate(ys)
    means = np.stack([x[y == c].mean(axis=0) for c in range(5)])
    vx, vy = zip(*val.iter_epoch(0), strict=True)
    predicted = np.argmin(((np.concatenate(vx).reshape(-1, 1, x.shape[1]) - means) ** 2).sum(-1), axis=1)
    assert (predicted == np.concatenate(vy)).mean() > 0.9  # chance: 0.2


def test_the_pool_is_bounded_and_the_epochs_cycle_through_it() -> None:
    source = SyntheticData(SyntheticDataConfig(image_size=64, length=3200, pool_mib=4))
    loader = source.loader("train", batch_size=32, shard=Shard(), seed=0)
    assert (len(loader), loader.pool_size) == (100, 2)  # a batch of 32 64px images: 1.5 MiB
    first, second, third = (b.inputs for b in loader.iter_epoch(0, start_batch=97))
    assert first is not second and (first == third).all()


def test_prepare_starts_the_runs_loaders_in_the_background_with_the_same_batches(ddlkit_pm, tmp_path) -> None:
    """data=synthetic's prepare makes the pools while the framework imports: the loaders the run asks
    for next are those, their batches the ones a loader made on demand gives."""
    from ddlkit.testing import make_run

    run = make_run(
        ddlkit_pm, tmp_path, "data=synthetic", "data.image_size=8", "data.length=256", "trainer.batch_size=16"
    )
    run.data.prepare(run)
    started = dict(run.data._started)
    assert {key[0] for key in started} == {"train", "val"}
    assert all(loader._maker is not None or loader._pool is not None for loader in started.values())
    train, val = run.loaders()  # what a framework asks for
    assert {id(train), id(val)} == {id(loader) for loader in started.values()} and not run.data._started
    fresh = SyntheticData(run.data.cfg).loader("train", batch_size=16, shard=Shard(), seed=run.cfg.trainer.seed)
    for made, expected in zip(train.pool, fresh.pool, strict=True):
        assert made.shape == expected.shape and (made == expected).all()


def test_an_error_making_the_pool_in_the_background_is_raised_where_the_pool_is_read(monkeypatch) -> None:
    loader = SyntheticData(SyntheticDataConfig(image_size=8)).loader("train", batch_size=4, shard=Shard(), seed=0)

    def fail() -> None:
        raise MemoryError("no room for the pool")

    monkeypatch.setattr(loader, "_make", fail)
    loader.start()
    with pytest.raises(MemoryError, match="no room for the pool"):
        next(iter(loader.iter_epoch(0)))
