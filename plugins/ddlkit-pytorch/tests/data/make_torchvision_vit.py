"""Writes ``torchvision_vit.json``, what ``test_vit.py`` and ``test_swin.py`` hold
``ddlkit_pytorch.vit`` and ``ddlkit_pytorch.swin`` to, from torchvision's own ViT and Swin code.
Run once, by hand; no test imports this file or torchvision.

torchvision's wheels do not load against the CPU torch here (their compiled ops fail to
register), so this loads only its pure-Python ``models/vision_transformer.py``,
``models/swin_transformer.py``, ``ops/misc.py`` and ``ops/stochastic_depth.py``, with the
packages around them replaced by empty modules::

    pip download --no-deps torchvision==0.28.0 -d /tmp/tv && unzip -q /tmp/tv/*.whl -d /tmp/tvsite
    python tests/data/make_torchvision_vit.py /tmp/tvsite/torchvision
"""

from __future__ import annotations

import enum
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).with_name("torchvision_vit.json")
NAMES = ("vit_b_16", "vit_l_16", "vit_h_14")
#: entries (beyond encoder_layer_0's) whose shapes the fixture keeps for every model
SWINS = ("swin_t", "swin_b")
SWIN_SPOT = {
    "swin_t": ("features.0.0.weight", "features.5.5.attn.qkv.weight", "head.weight"),
    "swin_b": (
        "features.0.0.weight",
        "features.5.17.attn.relative_position_bias_table",
        "features.5.17.attn.relative_position_index",
        "features.6.reduction.weight",
        "features.7.1.mlp.3.weight",
        "norm.weight",
        "head.weight",
    ),
}
SPOT = ("conv_proj.weight", "class_token", "encoder.pos_embedding", "encoder.ln.weight", "heads.head.weight")


class _InterpolationMode(enum.Enum):
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    NEAREST = "nearest"


def _package(name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def torchvision_models(root: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """``torchvision.models.vision_transformer`` and ``swin_transformer`` from the unpacked package
    at ``root``."""
    for sub in ("", ".models", ".ops", ".transforms"):
        _package(f"torchvision{sub}", root / sub.lstrip(".").replace(".", "/"))
    presets = types.ModuleType("torchvision.transforms._presets")  # only named in the weights' metadata
    presets.ImageClassification = type("ImageClassification", (), {})  # type: ignore[attr-defined]
    presets.InterpolationMode = _InterpolationMode  # type: ignore[attr-defined]
    sys.modules[presets.__name__] = presets
    _load("torchvision.ops.misc", root / "ops" / "misc.py")
    _load("torchvision.ops.stochastic_depth", root / "ops" / "stochastic_depth.py")
    return (
        _load("torchvision.models.vision_transformer", root / "models" / "vision_transformer.py"),
        _load("torchvision.models.swin_transformer", root / "models" / "swin_transformer.py"),
    )


def _version(root: Path) -> str:
    match = re.search(r"__version__ = '([^']+)'", (root / "version.py").read_text())
    return match[1] if match else "?"


def layout(model: torch.nn.Module) -> list[tuple[str, list[int]]]:
    return [(key, list(t.shape)) for key, t in model.state_dict().items()]


def reference_numerics(build: Any) -> dict[str, Any]:
    """What ``build(image_size=32, num_classes=10)`` computes from seed 0: the logits of two
    seeded images, the class token's encoder output and one gradient. The head, which torchvision
    initialises to zero (all logits 0), is drawn from seed 1 first."""
    torch.manual_seed(0)
    model = build(image_size=32, num_classes=10)
    torch.manual_seed(1)
    torch.nn.init.normal_(model.heads.head.weight, std=0.05)
    torch.nn.init.normal_(model.heads.head.bias, std=0.05)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    model.train()
    logits = model(images)
    torch.nn.functional.cross_entropy(logits, torch.tensor([3, 7])).backward()
    features = model.encoder(torch.cat([model.class_token.expand(2, -1, -1), model._process_input(images)], 1))
    return {
        "seed": 0,
        "head_seed": 1,
        "head_std": 0.05,
        "images_seed": 2,
        "labels": [3, 7],
        "logits": logits.tolist(),
        "class_token_features": features[:, 0, :8].tolist(),
        "conv_proj_grad_norm": model.conv_proj.weight.grad.norm().item(),
        "head_grad_norm": model.heads.head.weight.grad.norm().item(),
    }


def swin_numerics(build: Any) -> dict[str, Any]:
    """What ``build(num_classes=10)`` computes at 32 px from seed 0: logits in training (stochastic
    depth drawn from seed 3) and in evaluation, and one gradient."""
    torch.manual_seed(0)
    model = build(num_classes=10)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    model.train()
    torch.manual_seed(3)
    train_logits = model(images)
    torch.nn.functional.cross_entropy(train_logits, torch.tensor([3, 7])).backward()
    model.eval()
    with torch.no_grad():
        eval_logits = model(images)
    return {
        "seed": 0,
        "images_seed": 2,
        "stochastic_depth_seed": 3,
        "labels": [3, 7],
        "train_logits": train_logits.tolist(),
        "eval_logits": eval_logits.tolist(),
        "patch_embed_grad_norm": model.features[0][0].weight.grad.norm().item(),
    }


def main(root: Path) -> None:
    vit, swin = torchvision_models(root)
    models: dict[str, Any] = {}
    for name in NAMES:
        with torch.device("meta"):  # shapes only: no memory, no time
            model = getattr(vit, name)()
        entries = layout(model)
        shapes = dict(entries)
        models[name] = {
            "num_params": sum(p.numel() for p in model.parameters()),
            "num_entries": len(entries),
            "num_layers": len(model.encoder.layers),
            "patch_size": model.patch_size,
            "layer_0": [(k, s) for k, s in entries if k.startswith("encoder.layers.encoder_layer_0.")],
            "spot": {k: shapes[k] for k in SPOT},
        }
    for name in SWINS:
        with torch.device("meta"):
            model = getattr(swin, name)()
        entries = layout(model)
        shapes = dict(entries)
        models[name] = {
            "num_params": sum(p.numel() for p in model.parameters()),
            "num_entries": len(entries),
            "spot": {k: shapes[k] for k in SWIN_SPOT[name]},
        }
    with torch.device("meta"):
        b16 = vit.vit_b_16()
        swin_t = swin.swin_t()
    fixture = {
        "source": f"torchvision {_version(root)} models/vision_transformer.py, models/swin_transformer.py "
        "(tests/data/make_torchvision_vit.py)",
        "torch": torch.__version__,
        "models": models,
        "vit_b_16_224_state_dict": layout(b16),
        "vit_b_16_32px_numerics": reference_numerics(vit.vit_b_16),
        "swin_t_state_dict": layout(swin_t),
        "swin_t_32px_numerics": swin_numerics(swin.swin_t),
    }
    text = json.dumps(fixture, indent=1)
    # one state_dict entry, one list of numbers, per line
    text = re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m[1]) + "]", text)
    text = re.sub(r"\[\s*(\"[^\"]+\"),\s*(\[[^\]]*\])\s*\]", r"[\1, \2]", text)
    OUT.write_text(text + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
