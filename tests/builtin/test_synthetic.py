"""data=synthetic: the data-source contract, plus its one-batch-per-rank design."""

from __future__ import annotations

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


def test_numpy_batches_are_nhwc_float32() -> None:
    loader = SyntheticData(SyntheticDataConfig(image_size=8)).loader("numpy", "train", batch_size=4, shard=Shard(),
                                                                     seed=0)
    images, labels = next(iter(loader.iter_epoch(0)))
    assert (images.shape, str(images.dtype), labels.shape) == ((4, 8, 8, 3), "float32", (4,))


def test_a_small_validation_split_still_has_one_batch() -> None:
    source = SyntheticData(SyntheticDataConfig(val_length=8))
    assert len(source.loader("numpy", "val", batch_size=32, shard=Shard(), seed=0)) == 1


def test_an_unsupported_framework_is_refused() -> None:
    with pytest.raises(ValueError, match="data=synthetic has no loader for framework 'jax'"):
        SyntheticData(SyntheticDataConfig()).loader("jax", "train", batch_size=4, shard=Shard(), seed=0)
