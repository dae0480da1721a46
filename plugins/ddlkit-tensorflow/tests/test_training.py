"""The shared Keras pieces: PyTorch-exact SGD and loss, the checkpoint file, the exported model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("keras")

import keras

import ddlkit
from ddlkit.atomic import atomic_path
from ddlkit_tensorflow import training
from ddlkit_tensorflow.training import TorchSGD, cross_entropy, export_model, load_state, save_state

# a warm-up-like schedule: the learning rate changes every step, which is where Keras' own SGD
# (lr folded into the velocity) and PyTorch's part ways
LRS = [0.05, 0.1, 0.2, 0.4, 0.1]


@pytest.mark.parametrize("nesterov", [False, True])
def test_torch_sgd_matches_torch_optim_sgd(nesterov: bool) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3)).astype("float32")
    grads = [rng.standard_normal((4, 3)).astype("float32") for _ in LRS]

    ref = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.SGD([ref], lr=LRS[0], momentum=0.9, weight_decay=1e-2, nesterov=nesterov)
    w = keras.Variable(w0.copy())
    mine = TorchSGD(learning_rate=LRS[0], momentum=0.9, nesterov=nesterov, l2=1e-2)
    for lr, g in zip(LRS, grads, strict=True):
        for group in opt.param_groups:
            group["lr"] = lr
        ref.grad = torch.from_numpy(g)
        opt.step()
        mine.learning_rate = lr
        mine.apply([g], [w])
    np.testing.assert_allclose(np.asarray(w), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert int(mine.iterations) == len(LRS)


def test_torch_sgd_rejects_bad_hyperparameters() -> None:
    with pytest.raises(ValueError, match="momentum"):
        TorchSGD(momentum=1.0)
    with pytest.raises(ValueError, match="nesterov"):
        TorchSGD(momentum=0.0, nesterov=True)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_matches_torch(smoothing: float) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 5)).astype("float32")
    labels = rng.integers(0, 5, 8)
    expected = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits), torch.from_numpy(labels), label_smoothing=smoothing, reduction="none"
    ).numpy()
    got = np.asarray(cross_entropy(smoothing)(labels, logits))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def small_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(2, 3, name="conv")(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, name="fc")(keras.layers.Flatten()(x)))


def trained(seed: int, loss_scaling: bool = False) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    model = small_model(seed)
    opt = TorchSGD(learning_rate=0.1, momentum=0.9, l2=1e-4)
    if loss_scaling:
        opt = keras.optimizers.LossScaleOptimizer(opt)
    model.compile(optimizer=opt, loss=cross_entropy())
    x = np.random.default_rng(seed).standard_normal((8, 4, 4, 3)).astype("float32")
    model.fit(x, np.arange(8) % 3, epochs=2, batch_size=4, verbose=0)
    return model, opt


@pytest.mark.parametrize("loss_scaling", [False, True])
def test_a_checkpoint_restores_every_model_and_optimizer_variable(tmp_path: Path, loss_scaling: bool) -> None:
    model, opt = trained(1, loss_scaling)
    save_state(tmp_path / "ckpt", model, opt, {"state": {"step": 4}})
    fresh, fresh_opt = small_model(2), TorchSGD(learning_rate=0.5, momentum=0.9, l2=1e-4)
    if loss_scaling:
        fresh_opt = keras.optimizers.LossScaleOptimizer(fresh_opt)
    fresh_opt.build(fresh.trainable_variables)
    assert load_state(tmp_path / "ckpt", fresh, fresh_opt) == {"state": {"step": 4}}
    for a, b in zip(model.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    names = [v.path for v in opt.variables]
    assert any("momentum" in n for n in names) and any("iteration" in n for n in names)
    if loss_scaling:
        assert any("dynamic_scale" in n for n in names)
    for a, b in zip(opt.variables, fresh_opt.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)


def test_a_checkpoint_of_another_optimizer_setup_is_a_config_error(tmp_path: Path) -> None:
    model, opt = trained(1, loss_scaling=True)
    save_state(tmp_path / "ckpt", model, opt, {})
    plain = TorchSGD(momentum=0.9)
    plain.build(model.trainable_variables)
    with pytest.raises(ddlkit.ConfigError, match="trainer.precision"):
        load_state(tmp_path / "ckpt", model, plain)


def test_a_checkpoint_of_another_model_is_a_config_error(tmp_path: Path) -> None:
    model, opt = trained(1)
    save_state(tmp_path / "ckpt", model, opt, {})
    inputs = keras.Input((4, 4, 3))
    other = keras.Model(inputs, keras.layers.Dense(5, name="fc")(keras.layers.Flatten()(inputs)))
    with pytest.raises(ddlkit.ConfigError, match="does not fit this model"):
        load_state(tmp_path / "ckpt", other, opt)


def test_a_failed_save_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = trained(1)
    final = tmp_path / "checkpoints" / "step-00000004.ckpt"

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(training.np, "savez", disk_full)
    with pytest.raises(OSError, match="No space"), atomic_path(final) as tmp:
        save_state(tmp, model, opt, {})
    assert list(final.parent.iterdir()) == []


def test_the_exported_model_loads_for_scoring_without_ddlkit_objects(tmp_path: Path) -> None:
    model, _ = trained(1)
    export_model(model, tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")  # no custom_objects: nothing of ddlkit's inside
    assert not loaded.compiled
    x = np.ones((2, 4, 4, 3), "float32")
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), rtol=1e-6)


def test_the_gpu_peak_memory_is_tensorflow_s_largest_peak_over_the_rank_s_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run.device_peak_memory_mib on GPUs (issue 41, item 5); the GPUs' answers are stood in for here."""
    import tensorflow as tf

    from ddlkit_tensorflow.runtime import gpu_peak_memory

    assert gpu_peak_memory("cpu") is None  # result.json says the process's peak RSS instead
    asked = []

    def memory_info(device: str) -> dict[str, int]:
        asked.append(device)
        return {"current": 0, "peak": {"GPU:0": 3 << 30, "GPU:2": 5 << 30}[device]}

    monkeypatch.setattr(tf.config.experimental, "get_memory_info", memory_info)
    peak = gpu_peak_memory("cuda:0,cuda:2")
    assert peak is not None and peak() == 5 * 1024.0
    assert asked == ["GPU:0", "GPU:2"]
