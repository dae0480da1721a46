"""data=custom: samples from the user's function, batched, shuffled, sharded and resumed by ddlkit
as its own data are (the data-source contract), and its errors."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ddlkit
from ddlkit import DataSource, Shard
from ddlkit.builtin.custom_data import CustomData, CustomDataConfig
from ddlkit.custom import LAUNCH_DIR_ENV
from ddlkit.testing.contracts import DataSourceContract

MODULE = '''
import numpy as np


def arrays(split, n=64):
    rng = np.random.default_rng(0 if split == "train" else 1)
    return rng.standard_normal((n, 5)), rng.integers(0, 3, n)


class Samples:
    """A map-style dataset, as torch users write them (without torch)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((4, 4, 3), i, np.float32), i % 3


def sequence(split, n=48):
    return Samples(n if split == "train" else n // 4)


def scalar(split):
    return 42


def ragged(split):
    return np.zeros((8, 2)), np.zeros(7)


def failing(split):
    return {}["no such key"]
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "userdata.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))  # the ranks import from where ddlkit was started
    yield "userdata"
    sys.modules.pop("userdata", None)


def source(target: str, **overrides: object) -> CustomData:
    return CustomData(CustomDataConfig(target=target, **overrides))


class TestArrays(DataSourceContract):
    @pytest.fixture
    def data_source(self, user_module: str) -> DataSource:
        return source(f"{user_module}:arrays", num_classes=3)


class TestSequence(DataSourceContract):
    @pytest.fixture
    def data_source(self, user_module: str) -> DataSource:
        return source(f"{user_module}:sequence", num_classes=3, image_size=4)


def test_kwargs_reach_the_function_and_float64_becomes_float32(user_module: str) -> None:
    src = source(f"{user_module}:arrays", kwargs={"n": 10})
    assert (src.info.train_length, src.info.val_length) == (10, 10)
    x, y = next(iter(src.loader("train", batch_size=4, shard=Shard(), seed=0).iter_epoch(0)))
    assert (x.dtype, x.shape, y.dtype) == (np.float32, (4, 5), np.int64)


def test_every_sample_is_seen_once_per_epoch_across_ranks(user_module: str) -> None:
    src = source(f"{user_module}:sequence", kwargs={"n": 48})
    seen = [int(x[0, 0, 0, 0]) for rank in (0, 1)
            for b in src.loader("train", batch_size=6, shard=Shard(rank, 2), seed=1).iter_epoch(3)
            for x in np.split(b.inputs, len(b.inputs))]
    assert sorted(seen) == list(range(48))


@pytest.mark.parametrize(("target", "message"), [
    ("scalar", "data.target=userdata:scalar (split 'train') returned a int: return (inputs, targets) arrays or a "
               "sequence of (input, target) samples."),
    ("ragged", "data.target=userdata:ragged (split 'train') returned 8 inputs but 7 targets."),
    ("nothing", "data.target=userdata:nothing: module userdata has no 'nothing'."),
    ("failing", "data.target=userdata:failing raised KeyError: 'no such key'"),
])
def test_what_the_function_returns_is_checked(user_module: str, target: str, message: str) -> None:
    with pytest.raises(ddlkit.ConfigError) as info:
        _ = source(f"{user_module}:{target}").info
    assert str(info.value) == message


def test_a_path_without_a_colon_is_refused() -> None:
    with pytest.raises(ddlkit.ConfigError, match=r"^data.target=userdata.arrays is not an import path: write it as "
                                                  r"package.module:function.$"):
        _ = source("userdata.arrays").info
