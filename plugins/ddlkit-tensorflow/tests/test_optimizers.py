"""optimizer=sgd|adamw|lamb|lars for framework=tensorflow and keras: each is registered with the
shared schema, builds from its config node and trains; LARS (written here: Keras has none) matches
the reference update the PyTorch plugin's LARS is tested against too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("keras")

import keras

from ddlkit.optim import AdamWConfig, LambConfig, LarsConfig, SGDConfig
from ddlkit.testing.core import Registry, new_plugin_manager
from ddlkit.testing.optim import lars_reference

SCHEMAS = {"sgd": SGDConfig, "adamw": AdamWConfig, "lamb": LambConfig, "lars": LarsConfig}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.collect(new_plugin_manager())


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_every_shared_optimizer_is_registered_with_its_schema(registry: Registry, framework: str) -> None:
    assert registry.names_for("optimizer", framework) == sorted(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert registry.get_for("optimizer", framework, name).config is schema


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_optimizer_lowers_a_least_squares_loss(registry: Registry, name: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype("float32")
    y = x @ rng.standard_normal((8, 3)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, use_bias=False)])
    cfg = OmegaConf.structured(replace(SCHEMAS[name](), lr={"sgd": 0.05, "adamw": 0.1, "lamb": 0.1, "lars": 1.0}[name]))
    if name == "lars":  # steps of about trust_coefficient * ||w||: 2 % of the weights' norm per step
        cfg.trust_coefficient = 0.02
    model.compile(optimizer=registry.create_for("optimizer", "keras", name, cfg), loss="mse")
    history = model.fit(x, y, batch_size=64, epochs=30, verbose=0, shuffle=False).history["loss"]
    assert history[-1] < 0.5 * history[0], history


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_the_reference_update(registry: Registry, nesterov: bool) -> None:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((4, 3)), rng.standard_normal(3)]  # a kernel and a bias
    grads = [[rng.standard_normal(w.shape) for w in weights] for _ in range(4)]
    lrs = [0.5, 1.0, 2.0, 1.5]
    cfg = LarsConfig(momentum=0.9, weight_decay=1e-2, trust_coefficient=0.01, nesterov=nesterov)
    variables = [keras.Variable(w.astype("float64"), dtype="float64") for w in weights]
    optimizer = registry.create_for("optimizer", "tensorflow", "lars", OmegaConf.structured(cfg))
    optimizer.build(variables)
    for step, lr in zip(grads, lrs, strict=True):
        optimizer.learning_rate = lr
        optimizer.apply([g.astype("float64") for g in step], variables)
    for got, expected in zip(variables, lars_reference(weights, grads, lrs, cfg), strict=True):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-10, atol=1e-12)
