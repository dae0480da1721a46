"""What a framework=pytorch run says, through the real CLI (issue 22, items 2, 5, 7, 8; issue 23,
item 8): the threads each rank uses and why, the learning-rate rule, the start-up phases with
their times, progress lines that name the right epoch, and bad custom data refused in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

pytestmark = pytest.mark.slow

# a tiny CNN that reports what its rank was given: the thread count and OpenMP's wait policy
NETS = """
import os

import torch
from torch import nn


def cnn(classes=4):
    print(f"rank sees OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')} threads={torch.get_num_threads()}")
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, classes))


def float_labels(split):
    import numpy as np

    return np.zeros((16, 8, 8, 3), np.float32), np.arange(16) % 4 * 1.0
"""
# 4 steps per epoch; max_steps stops in the middle of epoch 2
RUN = [
    "model=custom",
    "model.target=nets:cnn",
    "data.image_size=8",
    "data.num_classes=4",
    "data.length=64",
    "data.val_length=16",
    "trainer.batch_size=16",
    "trainer.epochs=2",
    "trainer.max_steps=6",
    "trainer.log_every=2",
    "trainer.warmup_steps=1",
    "optimizer=adamw",
]


def ddlkit(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *overrides, f"hydra.run.dir={cwd / 'job'}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "DDLKIT_STATE_DIR": str(cwd / "s")},
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "nets.py").write_text(textwrap.dedent(NETS))
    return tmp_path


def test_what_a_run_says_from_start_to_end(project: Path) -> None:
    proc = ddlkit(project, *RUN)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    cores = len(os.sched_getaffinity(0))
    # item 2: auto threads (all the cores of this one-rank job), OpenMP's threads waiting passively
    assert f"rank sees OMP_WAIT_POLICY=PASSIVE threads={cores}" in out
    # items 2 and 5: the header says the threads and the learning-rate rule
    assert (
        f"| 1 rank(s) x {cores} thread(s) x batch 16 = 16 | 6 steps (4/epoch) | peak lr 0.00025 "
        "(0.001 x sqrt(16/256): optimizer.scale_lr=sqrt)"
    ) in out
    # item 7: the start-up phases, in order, with their times
    phases = re.findall(r"^ddlkit: \[ *\d+\.\ds\] (.*)$", out, re.M)
    assert phases == ["model built (0.000132M parameters)", "data ready", "first step done"], out
    # item 8: a step's epoch is the one it belongs to; a mid-epoch validation names its step; no
    # top-5 of 4 classes; every progress line has a rate
    progress = re.findall(r"^train epoch (\d)/2 step (\d)/6 .* img/s (\S+) ", out, re.M)
    assert [(e, s) for e, s, _ in progress] == [("1", "2"), ("1", "4"), ("2", "6")], out
    assert all(float(rate) > 0 for _, _, rate in progress)
    assert "epoch 1/2 validation: val_loss " in out
    assert "step 6/6 validation (in epoch 2/2): val_loss " in out
    assert "top5" not in out


def test_an_explicit_thread_count_is_kept_and_the_wait_policy_left_alone(project: Path) -> None:
    proc = ddlkit(project, *RUN, "framework.num_threads=1", "trainer.max_steps=1", "trainer.validate=false")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank sees OMP_WAIT_POLICY=None threads=1" in proc.stdout
    assert "| 1 rank(s) x 1 thread(s) x batch 16" in proc.stdout


def test_float_labels_of_custom_data_are_one_line_before_training(project: Path) -> None:
    proc = ddlkit(
        project,
        "model=custom",
        "model.target=nets:cnn",
        "data=custom",
        "data.target=nets:float_labels",
        "data.image_size=8",
        "data.num_classes=4",
        "trainer.batch_size=8",
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (
        "ConfigError: data.target=nets:float_labels (split 'train') gives float32 targets, but data.num_classes=4 "
        "means class indices"
    ) in proc.stderr
