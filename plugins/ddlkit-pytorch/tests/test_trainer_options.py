"""trainer.clip_grad_norm and trainer.accumulate_batches for framework=pytorch match the numpy
reference the TensorFlow and Keras plugins are tested against too (a float64 linear classifier:
accumulated micro-batches give the big batch's step, clipped after averaging), and every trainer
option of issue 22, item 10 works in a real training run."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from ddlkit.testing import RunFactory
from ddlkit.testing.core import BEST
from ddlkit.testing.optim import (
    EVERY_TRAINER_OPTION,
    LINEAR_BIAS,
    LINEAR_KERNEL,
    check_every_trainer_option,
    linear_data,
    linear_step,
)

torch = pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

MODULE = textwrap.dedent("""\
    import torch
    from ddlkit.testing.optim import LINEAR_BIAS, LINEAR_KERNEL

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3, dtype=torch.float64)
            with torch.no_grad():
                self.fc.weight.copy_(torch.tensor(LINEAR_KERNEL.T))
                self.fc.bias.copy_(torch.tensor(LINEAR_BIAS))

        def forward(self, x):
            return self.fc(x.double())

    class PrintEpochs:
        def on_epoch_end(self, run, epoch, metrics):
            if run.dist.is_main:
                print(f"callback: epoch {epoch} val_loss {metrics['val_loss']:.4f}", flush=True)
    """)

#: one plain SGD step of 16 samples at lr 0.5
LINEAR = [
    "framework=pytorch",
    "model=custom",
    "model.target=linear_model:Linear",
    "data=custom",
    "data.target=ddlkit.testing.optim:linear_data",
    "data.num_classes=3",
    "optimizer=sgd",
    "optimizer.lr=0.5",
    "optimizer.momentum=0",
    "optimizer.weight_decay=0",
    "optimizer.warmup_epochs=0",
    "optimizer.scale_lr=none",
    "trainer.epochs=1",
    "trainer.warmup_steps=0",
    "framework.num_threads=1",
    "logger=[]",
]


@pytest.fixture
def run_factory(run_factory: RunFactory) -> RunFactory:
    (run_factory.base_dir / "linear_model.py").write_text(MODULE)
    return run_factory


@pytest.mark.parametrize("clip", [None, 0.05])
def test_accumulated_and_clipped_step_matches_the_reference(run_factory: RunFactory, clip: float | None) -> None:
    # 4 micro-batches of 4: one optimizer step over all 16 samples
    out = run_factory(
        *LINEAR,
        "trainer.batch_size=4",
        "trainer.accumulate_batches=4",
        "trainer.validate=false",
        f"trainer.clip_grad_norm={clip if clip else 'null'}",
    ).assert_success()
    assert (out.result["steps"], out.result["global_batch_size"]) == (1, 16)
    weights = torch.load(out.job_dir / "model.pt", weights_only=True)
    x, y = linear_data()
    kernel, bias = linear_step(LINEAR_KERNEL, LINEAR_BIAS, x, y, lr=0.5, clip_grad_norm=clip)
    unclipped, _ = linear_step(LINEAR_KERNEL, LINEAR_BIAS, x, y, lr=0.5)
    assert clip is None or np.abs(unclipped - kernel).max() > 1e-3  # the clip does clip
    # torch.nn.utils.clip_grad_norm_ divides by the norm + 1e-6: agreement to ~1e-8 when it clips
    atol = 1e-7 if clip else 1e-12
    np.testing.assert_allclose(weights["fc.weight"].numpy().T, kernel, rtol=1e-10, atol=atol)
    np.testing.assert_allclose(weights["fc.bias"].numpy(), bias, rtol=1e-10, atol=atol)


@pytest.mark.slow
def test_two_ranks_accumulate_and_clip_as_one(run_factory: RunFactory) -> None:
    # 2 ranks x 2 micro-batches of 4 under DDP (no_sync but in the last): the same step over 16 samples
    out = run_factory(
        *LINEAR,
        "compute=local_mpi",
        "compute.procs_per_node=2",
        "dist=native",
        "trainer.batch_size=4",
        "trainer.accumulate_batches=2",
        "trainer.validate=false",
        "trainer.clip_grad_norm=0.05",
    ).assert_success()
    assert (out.result["steps"], out.result["global_batch_size"], out.result["world_size"]) == (1, 16, 2)
    weights = torch.load(out.job_dir / "model.pt", weights_only=True)
    kernel, bias = linear_step(LINEAR_KERNEL, LINEAR_BIAS, *linear_data(), lr=0.5, clip_grad_norm=0.05)
    np.testing.assert_allclose(weights["fc.weight"].numpy().T, kernel, rtol=1e-10, atol=1e-7)
    np.testing.assert_allclose(weights["fc.bias"].numpy(), bias, rtol=1e-10, atol=1e-7)


def test_every_trainer_option_in_one_run(run_factory: RunFactory) -> None:
    out = run_factory(*LINEAR, *EVERY_TRAINER_OPTION).assert_success()
    best = check_every_trainer_option(out)
    meta = torch.load(out.job_dir / "checkpoints" / BEST, weights_only=True)["meta"]
    assert meta["state"]["step"] == best["step"]
