"""Checks that ddlkit_pytorch.models reproduces torchvision's ResNets exactly.

torchvision cannot be imported here, so the expected layout is encoded
independently: a small generator rebuilds torchvision's state_dict key order
and shapes from the architecture description, and it is anchored to
torchvision's published parameter counts and to hand-counted entry totals, so
a mistake in the generator and the same mistake in the model cannot cancel out.
"""

from __future__ import annotations

import pytest
import torch

from ddlkit_pytorch.models import MODELS, build_model

Shape = tuple[int, ...]

# (block kind, blocks per stage), as in torchvision.models.resnet.
ARCH: dict[str, tuple[str, list[int]]] = {
    "resnet18": ("basic", [2, 2, 2, 2]),
    "resnet34": ("basic", [3, 4, 6, 3]),
    "resnet50": ("bottleneck", [3, 4, 6, 3]),
    "resnet101": ("bottleneck", [3, 4, 23, 3]),
    "resnet152": ("bottleneck", [3, 8, 36, 3]),
}

# torchvision's documented parameter counts (num_classes=1000).
TORCHVISION_NUM_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}

# len(state_dict()) counted by hand: stem conv(1) + bn(5: weight, bias,
# running_mean, running_var, num_batches_tracked) = 6; BasicBlock 2 convs +
# 2 BNs = 12; Bottleneck 3 + 15 = 18; each downsample 1 + 5 = 6 (layers 2-4 for
# BasicBlock, all four layers for Bottleneck since channels go 64 -> 256); fc 2.
#   resnet18:  6 +  8*12 + 3*6 + 2 = 122
#   resnet34:  6 + 16*12 + 3*6 + 2 = 218
#   resnet50:  6 + 16*18 + 4*6 + 2 = 320
#   resnet101: 6 + 33*18 + 4*6 + 2 = 626
#   resnet152: 6 + 50*18 + 4*6 + 2 = 932
TORCHVISION_NUM_ENTRIES = {
    "resnet18": 122,
    "resnet34": 218,
    "resnet50": 320,
    "resnet101": 626,
    "resnet152": 932,
}


def expected_state_dict(name: str, num_classes: int = 1000) -> list[tuple[str, Shape]]:
    """torchvision's ordered (key, shape) list, derived from its module tree."""
    kind, layers = ARCH[name]
    expansion = 1 if kind == "basic" else 4
    out: list[tuple[str, Shape]] = []

    def conv(prefix: str, cout: int, cin: int, k: int) -> None:
        out.append((f"{prefix}.weight", (cout, cin, k, k)))

    def bn(prefix: str, c: int) -> None:
        for suffix in ("weight", "bias", "running_mean", "running_var"):
            out.append((f"{prefix}.{suffix}", (c,)))
        out.append((f"{prefix}.num_batches_tracked", ()))

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    inplanes = 64
    for stage, (planes, nblocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True), start=1):
        stride = 1 if stage == 1 else 2
        for i in range(nblocks):
            p = f"layer{stage}.{i}"
            if kind == "basic":
                conv(f"{p}.conv1", planes, inplanes, 3)
                bn(f"{p}.bn1", planes)
                conv(f"{p}.conv2", planes, planes, 3)
                bn(f"{p}.bn2", planes)
            else:
                conv(f"{p}.conv1", planes, inplanes, 1)
                bn(f"{p}.bn1", planes)
                conv(f"{p}.conv2", planes, planes, 3)
                bn(f"{p}.bn2", planes)
                conv(f"{p}.conv3", planes * 4, planes, 1)
                bn(f"{p}.bn3", planes * 4)
            if i == 0 and (stride != 1 or inplanes != planes * expansion):
                conv(f"{p}.downsample.0", planes * expansion, inplanes, 1)
                bn(f"{p}.downsample.1", planes * expansion)
            inplanes = planes * expansion
    out.append(("fc.weight", (num_classes, 512 * expansion)))
    out.append(("fc.bias", (num_classes,)))
    return out


_CACHE: dict[tuple[str, int], torch.nn.Module] = {}


def model(name: str, num_classes: int = 1000) -> torch.nn.Module:
    # The random weight init dominates construction time (resnet152 takes
    # over 1 s on a 2-core CPU), so each configuration is built once per run.
    # Tests that use these shared models must not mutate their weights.
    key = (name, num_classes)
    if key not in _CACHE:
        _CACHE[key] = build_model(name, num_classes=num_classes)
    return _CACHE[key]


def layout(m: torch.nn.Module) -> list[tuple[str, Shape]]:
    return [(k, tuple(v.shape)) for k, v in m.state_dict().items()]


def test_models_registry_keys() -> None:
    assert list(MODELS) == ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]


@pytest.mark.parametrize("name", list(ARCH))
def test_parameter_count_matches_torchvision(name: str) -> None:
    n = sum(p.numel() for p in model(name).parameters())
    assert n == TORCHVISION_NUM_PARAMS[name]


@pytest.mark.parametrize("name", list(ARCH))
def test_expected_layout_is_self_consistent(name: str) -> None:
    # Guards the generator itself against the hand counts and published numbers.
    exp = expected_state_dict(name)
    assert len(exp) == TORCHVISION_NUM_ENTRIES[name]
    n_params = sum(
        torch.Size(shape).numel()
        for key, shape in exp
        if not key.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )
    assert n_params == TORCHVISION_NUM_PARAMS[name]


@pytest.mark.parametrize("name", list(ARCH))
def test_state_dict_keys_and_shapes_match_torchvision(name: str) -> None:
    got = layout(model(name))
    assert len(got) == TORCHVISION_NUM_ENTRIES[name]
    assert got == expected_state_dict(name)


def test_entry_counts_resnet18_resnet50() -> None:
    assert len(model("resnet18").state_dict()) == 122
    assert len(model("resnet50").state_dict()) == 320


def test_spot_check_keys() -> None:
    sd18 = model("resnet18").state_dict()
    sd50 = model("resnet50").state_dict()

    assert tuple(sd50["layer1.0.downsample.0.weight"].shape) == (256, 64, 1, 1)
    assert "layer1.0.downsample.0.weight" not in sd18
    assert tuple(sd18["layer2.0.downsample.0.weight"].shape) == (128, 64, 1, 1)
    assert "layer2.1.downsample.0.weight" not in sd18

    assert tuple(sd50["layer4.2.conv3.weight"].shape) == (2048, 512, 1, 1)
    assert "layer4.2.conv3.weight" not in sd18
    assert "layer4.3.conv1.weight" not in sd50

    # ResNet v1.5: stride lives on conv2 (3x3), conv1 is a plain 1x1.
    m50 = model("resnet50")
    assert m50.layer2[0].conv1.stride == (1, 1)
    assert m50.layer2[0].conv2.stride == (2, 2)
    assert m50.layer2[0].downsample[0].stride == (2, 2)

    assert tuple(sd50["fc.weight"].shape) == (1000, 2048)
    assert tuple(sd18["fc.weight"].shape) == (1000, 512)
    assert sd50["bn1.num_batches_tracked"].shape == ()
    # torchvision convs carry no bias.
    assert not any(k.endswith("conv1.bias") or k.endswith("downsample.0.bias") for k in sd50)


def test_num_classes_changes_only_fc() -> None:
    assert layout(model("resnet18", num_classes=10)) == expected_state_dict("resnet18", num_classes=10)


@pytest.mark.parametrize(("name", "num_classes"), [("resnet18", 10), ("resnet18", 1000), ("resnet50", 1000)])
@pytest.mark.parametrize("size", [32, 64])
def test_forward_small_inputs(name: str, num_classes: int, size: int) -> None:
    # 32x32 leaves a 1x1 map after layer4; adaptive pooling must still work.
    m = model(name, num_classes).eval()
    with torch.no_grad():
        y = m(torch.randn(2, 3, size, size))
    assert y.shape == (2, num_classes)
    assert torch.isfinite(y).all()


def test_forward_train_mode_backward() -> None:
    m = model("resnet18", num_classes=10).train()
    # Snapshot/restore BN running stats so the shared model stays pristine.
    saved = {k: v.clone() for k, v in m.state_dict().items()}
    try:
        y = m(torch.randn(2, 3, 64, 64))
        assert y.shape == (2, 10)
        y.sum().backward()
        assert m.conv1.weight.grad is not None
    finally:
        m.zero_grad(set_to_none=True)
        m.load_state_dict(saved)
        m.eval()


def test_state_dict_round_trip_strict() -> None:
    src = model("resnet18", num_classes=10)
    dst = build_model("resnet18", num_classes=10)
    dst.load_state_dict(src.state_dict(), strict=True)
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_default_init() -> None:
    m = model("resnet18")
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            assert torch.all(mod.weight == 1)
            assert torch.all(mod.bias == 0)
    # kaiming fan_out for the stem: std = sqrt(2 / (64 * 7 * 7)) ~= 0.0289.
    std = m.conv1.weight.std().item()
    assert 0.024 < std < 0.034


@pytest.mark.parametrize(
    ("name", "last_bn", "other_bns"),
    [("resnet18", "bn2", ("bn1",)), ("resnet50", "bn3", ("bn1", "bn2"))],
)
def test_zero_init_residual(name: str, last_bn: str, other_bns: tuple[str, ...]) -> None:
    m = build_model(name, zero_init_residual=True)
    blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    assert blocks
    for b in blocks:
        assert torch.all(getattr(b, last_bn).weight == 0)
        for bn in other_bns:
            assert torch.all(getattr(b, bn).weight == 1)
        if b.downsample is not None:
            assert torch.all(b.downsample[1].weight == 1)
    assert torch.all(m.bn1.weight == 1)

    # Without the flag, the last BN stays at 1.
    plain = model(name)
    assert torch.all(getattr(plain.layer1[0], last_bn).weight == 1)


def test_unknown_model_error_lists_choices() -> None:
    with pytest.raises(ValueError) as excinfo:
        build_model("resnet9000")
    assert not isinstance(excinfo.value, KeyError)
    msg = str(excinfo.value)
    assert msg.startswith("unknown model 'resnet9000'; choose one of: ")
    for choice in MODELS:
        assert choice in msg
