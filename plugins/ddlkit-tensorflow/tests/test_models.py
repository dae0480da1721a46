"""ddlkit_tensorflow.models builds the same networks as the PyTorch plugin (torchvision's layout)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("keras")

import keras

from ddlkit_tensorflow.models import MODELS, build_model

# torchvision's documented parameter counts (num_classes=1000)
TORCHVISION_NUM_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}
# BatchNorm layers: stem 1 + convs per block (2 basic / 3 bottleneck) + one per projection shortcut
NUM_BATCHNORMS = {
    "resnet18": 1 + 8 * 2 + 3,
    "resnet34": 1 + 16 * 2 + 3,
    "resnet50": 1 + 16 * 3 + 4,
    "resnet101": 1 + 33 * 3 + 4,
    "resnet152": 1 + 50 * 3 + 4,
}


def count(weights: list) -> int:
    return sum(int(np.prod(w.shape)) for w in weights)


@pytest.mark.parametrize("name", list(TORCHVISION_NUM_PARAMS))
def test_parameter_counts_equal_torchvision(name: str) -> None:
    model = build_model(name, num_classes=1000)
    assert count(model.trainable_weights) == TORCHVISION_NUM_PARAMS[name]
    batchnorms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(batchnorms) == NUM_BATCHNORMS[name]
    # the non-trainable weights are exactly the BatchNorm running statistics
    assert count(model.non_trainable_weights) == 2 * sum(bn.gamma.shape[0] for bn in batchnorms)


def test_every_model_is_registered_for_tensorflow_and_keras() -> None:
    from ddlkit_tensorflow.components import RESNETS, models

    assert tuple(MODELS) == RESNETS
    for framework in ("tensorflow", "keras"):
        assert [r.name for r in models(framework)] == [*RESNETS, "custom"]


@pytest.mark.parametrize(
    ("name", "size", "input_size"), [("resnet18", 32, 32), ("resnet50", 64, 64), ("resnet18", None, 40)]
)
def test_forward_gives_float32_logits(name: str, size: int | None, input_size: int) -> None:
    model = build_model(name, num_classes=10, image_size=size)
    images = np.random.default_rng(0).standard_normal((2, input_size, input_size, 3)).astype("float32")
    logits = model(images, training=False)
    assert tuple(logits.shape) == (2, 10) and keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.isfinite(np.asarray(logits)).all()


def test_logits_stay_float32_under_mixed_precision() -> None:
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model("resnet18", num_classes=10, image_size=32)
        assert model.get_layer("layer1.0.conv1").compute_dtype == "bfloat16"
        assert keras.backend.standardize_dtype(model(np.zeros((1, 32, 32, 3), "float32")).dtype) == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_zero_init_residual_zeroes_each_branch_last_batchnorm() -> None:
    model = build_model("resnet50", num_classes=10, zero_init_residual=True)
    assert not np.asarray(model.get_layer("layer3.5.bn3").gamma).any()
    assert np.all(np.asarray(model.get_layer("layer3.5.bn2").gamma) == 1)
    assert np.all(np.asarray(model.get_layer("layer1.0.downsample.1").gamma) == 1)
    assert np.all(np.asarray(build_model("resnet18", 10).get_layer("layer1.0.bn2").gamma) == 1)


def test_same_shaped_kernels_are_initialised_independently() -> None:
    model = build_model("resnet18", num_classes=10)
    a, b = (np.asarray(model.get_layer(n).kernel) for n in ("layer1.0.conv1", "layer1.0.conv2"))
    assert not np.array_equal(a, b)
    # kaiming normal, fan_out: std = sqrt(2 / (3 * 3 * 64))
    assert np.std(a) == pytest.approx(np.sqrt(2 / (9 * 64)), rel=0.1)


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet9'; choose one of: resnet18, resnet34"):
        build_model("resnet9", 10)


def torch_to_keras(torch_model: object, model: keras.Model) -> None:
    """Copy a torchvision-layout state_dict into the Keras model, layer by torchvision name."""
    state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    for layer in model.layers:
        p = layer.name
        if isinstance(layer, keras.layers.Conv2D):
            layer.set_weights([state[f"{p}.weight"].transpose(2, 3, 1, 0)])  # OIHW -> HWIO
        elif isinstance(layer, keras.layers.BatchNormalization):
            layer.set_weights([state[f"{p}.{k}"] for k in ("weight", "bias", "running_mean", "running_var")])
        elif isinstance(layer, keras.layers.Dense):
            layer.set_weights([state["fc.weight"].T, state["fc.bias"]])


@pytest.fixture
def torch_models() -> Iterator[object]:
    torch = pytest.importorskip("torch")
    models = pytest.importorskip("ddlkit_pytorch.models")
    torch.manual_seed(0)
    yield models


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_numerically_the_same_network_as_the_pytorch_plugin(name: str, torch_models: object) -> None:
    import torch

    reference = torch_models.build_model(name, num_classes=10).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so the test sees them used
        for module in reference.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
    model = build_model(name, num_classes=10, image_size=64)
    torch_to_keras(reference, model)
    images = np.random.default_rng(1).standard_normal((2, 64, 64, 3)).astype("float32")
    with torch.no_grad():
        expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
    got = np.asarray(model(images, training=False))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
