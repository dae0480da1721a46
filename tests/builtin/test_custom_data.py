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
    seen = [
        int(x[0, 0, 0, 0])
        for rank in (0, 1)
        for b in src.loader("train", batch_size=6, shard=Shard(rank, 2), seed=1).iter_epoch(3)
        for x in np.split(b.inputs, len(b.inputs))
    ]
    assert sorted(seen) == list(range(48))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "scalar",
            "data.target=userdata:scalar (split 'train') returned a int: return (inputs, targets) arrays or a "
            "sequence of (input, target) samples.",
        ),
        ("ragged", "data.target=userdata:ragged (split 'train') returned 8 inputs but 7 targets."),
        ("nothing", "data.target=userdata:nothing: module userdata has no 'nothing'."),
        ("failing", "data.target=userdata:failing raised KeyError: 'no such key'"),
    ],
)
def test_what_the_function_returns_is_checked(user_module: str, target: str, message: str) -> None:
    with pytest.raises(ddlkit.ConfigError) as info:
        _ = source(f"{user_module}:{target}").info
    assert str(info.value) == message


def test_a_path_without_a_colon_is_refused() -> None:
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"^data.target=userdata.arrays is not an import path: write it as "
        r"package.module:function.$",
    ):
        _ = source("userdata.arrays").info


BAD_SAMPLES = """
import numpy as np


def float_labels(split):
    return np.zeros((8, 5), np.float32), np.array([0.0, 1.0] * 4)


def strings(split):
    return np.array([["a", "b"]] * 8), np.zeros(8, np.int64)


def big_label(split):
    return np.zeros((8, 5), np.float32), np.arange(8)


def negative_label(split):
    return np.zeros((8, 5), np.float32), np.full(8, -1)


def one_hot(split):
    return np.zeros((8, 5), np.float32), np.eye(4, dtype=np.int64)[np.arange(8) % 4]


def wrong_shape(split):
    return [(np.zeros((28, 28), np.float32), 1)] * 8


def ragged_samples(split):
    return [(np.zeros((i + 1,), np.float32), 1) for i in range(8)]
"""


@pytest.mark.parametrize(
    ("target", "overrides", "message"),
    [
        (
            "float_labels",
            {"num_classes": 4},
            "data.target=baddata:float_labels (split 'train') gives float32 targets, but "
            "data.num_classes=4 means class indices: return integers (e.g. labels.astype(np.int64)), or set "
            "data.num_classes=0 and model.loss for another task.",
        ),
        (
            "strings",
            {},
            "data.target=baddata:strings (split 'train') gives inputs of dtype <U1: inputs must be numbers. "
            "Convert them in your function (e.g. np.asarray(x, dtype=np.float32)).",
        ),
        (
            "big_label",
            {"num_classes": 4},
            "data.target=baddata:big_label (split 'train') gives class 7, but "
            "data.num_classes=4 allows 0 to 3. Set data.num_classes=8 or fix the labels.",
        ),
        (
            "negative_label",
            {"num_classes": 4},
            "data.target=baddata:negative_label (split 'train') gives class -1: class "
            "indices run from 0 to data.num_classes - 1 (3). Fix the labels.",
        ),
        (
            "one_hot",
            {"num_classes": 4},
            "data.target=baddata:one_hot (split 'train') gives targets of shape (4,) per "
            "sample, but data.num_classes=4 means one class index per sample (one-hot labels: take their argmax). Or "
            "set "
            "data.num_classes=0 and model.loss for another task.",
        ),
        (
            "wrong_shape",
            {"num_classes": 4, "image_size": 32},
            "data.target=baddata:wrong_shape (split 'train') gives "
            "inputs of shape (28, 28) per sample, but data.image_size=32 means 32x32x3 images (height, width, "
            "channels). "
            "Give them that shape, set data.image_size to their size, or data.image_size=0 to give the inputs to the "
            "model "
            "as they are.",
        ),
        (
            "ragged_samples",
            {},
            "data.target=baddata:ragged_samples (split 'train'): its first samples do not stack into a "
            "batch (all input arrays must have the same shape): every input must have the same shape, and every target "
            "too.",
        ),
    ],
)
def test_samples_are_checked_against_the_config_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, overrides: dict, message: str
) -> None:
    """Issue 23, item 8: these reached the framework and failed there with a 50-70-line traceback."""
    (tmp_path / "baddata.py").write_text(BAD_SAMPLES)
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.delitem(sys.modules, "baddata", raising=False)
    with pytest.raises(ddlkit.ConfigError) as info:
        _ = source(f"baddata:{target}", **overrides).info
    assert str(info.value) == message
