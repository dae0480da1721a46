"""optimizer=sgd|adamw|lamb|lars for framework=pytorch: each is registered with the shared schema,
builds from its config node, and trains; LARS (pytorch-optimizer's) matches the reference update
that the TensorFlow plugin's LARS is tested against too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ddlkit.optim import AdamWConfig, LambConfig, LarsConfig, SGDConfig
from ddlkit.testing.core import Registry, new_plugin_manager
from ddlkit.testing.optim import lars_reference

SCHEMAS = {"sgd": SGDConfig, "adamw": AdamWConfig, "lamb": LambConfig, "lars": LarsConfig}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.collect(new_plugin_manager())


def test_every_shared_optimizer_is_registered_with_its_schema(registry: Registry) -> None:
    assert registry.names_for("optimizer", "pytorch") == sorted(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert registry.get_for("optimizer", "pytorch", name).config is schema


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_optimizer_lowers_a_least_squares_loss(registry: Registry, name: str) -> None:
    torch.manual_seed(0)
    x, true = torch.randn(64, 8), torch.randn(8, 3)
    y = x @ true
    model = torch.nn.Linear(8, 3, bias=False)
    cfg = OmegaConf.structured(replace(SCHEMAS[name](), lr={"sgd": 0.05, "adamw": 0.1, "lamb": 0.1, "lars": 1.0}[name]))
    if name == "lars":  # steps of about trust_coefficient * ||w||: 2 % of the weights' norm per step
        cfg.trust_coefficient = 0.02
    optimizer = registry.create_for("optimizer", "pytorch", name, cfg, model.parameters())
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_the_reference_update(registry: Registry, nesterov: bool) -> None:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((4, 3)), rng.standard_normal(3)]  # a kernel and a bias
    grads = [[rng.standard_normal(w.shape) for w in weights] for _ in range(4)]
    lrs = [0.5, 1.0, 2.0, 1.5]
    cfg = LarsConfig(momentum=0.9, weight_decay=1e-2, trust_coefficient=0.01, nesterov=nesterov)
    params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in weights]
    optimizer = registry.create_for("optimizer", "pytorch", "lars", OmegaConf.structured(cfg), params)
    for step, lr in zip(grads, lrs, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = lr
        for p, g in zip(params, step, strict=True):
            p.grad = torch.tensor(g)
        optimizer.step()
    for got, expected in zip(params, lars_reference(weights, grads, lrs, cfg), strict=True):
        np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "kernel,expected", [("fused", {"fused": True}), ("foreach", {"foreach": True}), ("for_loop", {"foreach": False})]
)
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_framework_optimizer_kernel_reaches_torch(registry: Registry, name: str, kernel: str, expected: dict) -> None:
    from types import SimpleNamespace

    from ddlkit_pytorch.framework import PytorchConfig, PytorchFramework

    framework = PytorchFramework(OmegaConf.structured(PytorchConfig(optimizer_kernel=kernel)))
    run = SimpleNamespace(cfg=SimpleNamespace(optimizer=SimpleNamespace(name=name)))
    chosen = framework._optimizer_kernel(run, torch.device("cpu"))
    assert chosen == expected
    model = torch.nn.Linear(4, 2)
    optimizer = registry.create_for(
        "optimizer", "pytorch", name, OmegaConf.structured(SCHEMAS[name]()), model.parameters(), **chosen
    )
    assert all(optimizer.defaults[k] is v for k, v in expected.items())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    # auto: fused on a CUDA GPU, torch's own default on the CPU; LAMB and LARS take no such keyword
    auto = PytorchFramework(OmegaConf.structured(PytorchConfig()))
    assert auto._optimizer_kernel(run, torch.device("cuda")) == {"fused": True}
    assert auto._optimizer_kernel(run, torch.device("cpu")) == {}
    lars = SimpleNamespace(cfg=SimpleNamespace(optimizer=SimpleNamespace(name="lars")))
    assert auto._optimizer_kernel(lars, torch.device("cuda")) == {}


def test_an_optimizer_kernel_for_lamb_or_lars_is_refused_before_anything_runs(tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "plan",
            "framework=pytorch",
            "optimizer=lars",
            "framework.optimizer_kernel=fused",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "framework.optimizer_kernel=fused applies to optimizer=sgd or adamw, not optimizer=lars: leave it at auto."
    ) in proc.stderr
