"""trainer.clip_grad_norm and trainer.accumulate_batches for framework=tensorflow (a custom loop:
micro-batches summed in one tf.function, clipped after the all-reduce) and framework=keras (fit:
Keras' own accumulation and clipping) match the numpy reference the PyTorch plugin is tested
against too (a float64 linear classifier: accumulated micro-batches give the big batch's step),
and every trainer option of issue 22, item 10 works in a real training run."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from ddlkit.testing import RunFactory
from ddlkit.testing.optim import (
    EVERY_TRAINER_OPTION,
    LINEAR_BIAS,
    LINEAR_KERNEL,
    check_every_trainer_option,
    linear_data,
    linear_step,
)

pytest.importorskip("keras")
pytest.importorskip("ddlkit_tensorflow")

import keras

from ddlkit_tensorflow.runtime import horovod_problem

pytestmark = pytest.mark.slow

NEEDS_HOROVOD = pytest.mark.skipif(horovod_problem("tensorflow") is not None, reason=str(horovod_problem("tensorflow")))

MODULE = textwrap.dedent("""\
    import keras
    from ddlkit.testing.optim import LINEAR_BIAS, LINEAR_KERNEL

    def linear():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(
            3, dtype="float64", kernel_initializer=keras.initializers.Constant(LINEAR_KERNEL),
            bias_initializer=keras.initializers.Constant(LINEAR_BIAS))])

    def cross_entropy(labels, logits):  # in float64, as the model computes
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    class PrintEpochs:
        def on_epoch_end(self, run, epoch, metrics):
            if run.dist.is_main:
                print(f"callback: epoch {epoch} val_loss {metrics['val_loss']:.4f}", flush=True)
    """)

LINEAR = [
    "model=custom",
    "model.target=linear_model:linear",
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
FRAMEWORKS = ["tensorflow", "keras"]


@pytest.fixture
def run_factory(run_factory: RunFactory) -> RunFactory:
    (run_factory.base_dir / "linear_model.py").write_text(MODULE)
    return run_factory


def weights(path) -> list[np.ndarray]:
    return [np.asarray(w) for w in keras.models.load_model(path, compile=False).weights]


@pytest.mark.parametrize("clip", [None, 0.05])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_accumulated_and_clipped_step_matches_the_reference(
    run_factory: RunFactory, framework: str, clip: float | None
) -> None:
    # 4 micro-batches of 4: one optimizer step over all 16 samples
    out = run_factory(
        f"framework={framework}",
        *LINEAR,
        "model.loss=linear_model:cross_entropy",
        "trainer.batch_size=4",
        "trainer.accumulate_batches=4",
        "trainer.validate=false",
        f"trainer.clip_grad_norm={clip if clip else 'null'}",
    ).assert_success()
    assert (out.result["steps"], out.result["global_batch_size"]) == (1, 16)
    kernel, bias = linear_step(LINEAR_KERNEL, LINEAR_BIAS, *linear_data(), lr=0.5, clip_grad_norm=clip)
    got_kernel, got_bias = weights(out.job_dir / "model.keras")
    # fit's compiled loss casts the logits to float32 (Keras' Loss computes in floatx): float32's precision
    rtol = 1e-6 if framework == "keras" else 1e-10
    np.testing.assert_allclose(got_kernel, kernel, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(got_bias, bias, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize(
    ("framework", "backend"),
    [
        ("tensorflow", "native"),
        pytest.param("tensorflow", "horovod", marks=NEEDS_HOROVOD),
        pytest.param("keras", "horovod", marks=NEEDS_HOROVOD),
    ],
)
def test_two_ranks_clip_the_all_reduced_gradient(run_factory: RunFactory, framework: str, backend: str) -> None:
    # 2 ranks x 2 micro-batches of 4: the same step over 16 samples, clipped by the norm of the
    # ranks' summed gradient. Under MultiWorkerMirroredStrategy Keras' own clipping would clip each
    # rank's (the loop clips); Horovod's all-reduce comes before the optimizer's clipping (fit)
    out = run_factory(
        f"framework={framework}",
        *LINEAR,
        "model.loss=linear_model:cross_entropy",
        "compute=local_mpi",
        "compute.procs_per_node=2",
        f"dist={backend}",
        "trainer.batch_size=4",
        "trainer.accumulate_batches=2",
        "trainer.validate=false",
        "trainer.clip_grad_norm=0.05",
        timeout=300,
    ).assert_success()
    assert (out.result["steps"], out.result["global_batch_size"], out.result["world_size"]) == (1, 16, 2)
    kernel, bias = linear_step(LINEAR_KERNEL, LINEAR_BIAS, *linear_data(), lr=0.5, clip_grad_norm=0.05)
    got_kernel, got_bias = weights(out.job_dir / "model.keras")
    # fit's compiled loss casts the logits to float32 (Keras' Loss computes in floatx): float32's precision
    rtol = 1e-6 if framework == "keras" else 1e-10
    np.testing.assert_allclose(got_kernel, kernel, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(got_bias, bias, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_trainer_option_in_one_run(run_factory: RunFactory, framework: str) -> None:
    check_every_trainer_option(run_factory(f"framework={framework}", *LINEAR, *EVERY_TRAINER_OPTION).assert_success())
