"""ddlkit_pytorch.vit reproduces torchvision's Vision Transformers, and ``model=vit_*`` trains
through the CLI.

torchvision cannot be imported here, so what torchvision 0.28 builds was written once from its
own ``models/vision_transformer.py`` into ``data/torchvision_vit.json`` (``data/
make_torchvision_vit.py`` says how): state_dict keys and shapes, parameter counts, and the logits
and gradients of ViT-B/16 at 32 px from a fixed seed. The published parameter counts below anchor
the fixture itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import ddlkit
from ddlkit.testing import RunFactory

torch = pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

from ddlkit_pytorch import components, vit  # noqa: E402

FIXTURE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "torchvision_vit.json").read_text())
EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"

#: torchvision's documented parameter counts (224 px, 1000 classes)
TORCHVISION_NUM_PARAMS = {"vit_b_16": 86_567_656, "vit_l_16": 304_326_632, "vit_h_14": 632_045_800}
NAMES = list(TORCHVISION_NUM_PARAMS)


def on_meta(name: str, **kwargs: Any) -> torch.nn.Module:
    """The model with its tensors on the meta device: shapes without memory (ViT-H is 2.5 GB)."""
    with torch.device("meta"):
        return vit.MODELS[name](**kwargs)


def layout(model: torch.nn.Module) -> list[list[Any]]:
    return [[key, list(t.shape)] for key, t in model.state_dict().items()]


def test_the_fixture_holds_torchvisions_published_parameter_counts() -> None:
    assert {name: FIXTURE["models"][name]["num_params"] for name in NAMES} == TORCHVISION_NUM_PARAMS


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_matches_torchvision(name: str) -> None:
    model = on_meta(name)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_NUM_PARAMS[name]
    assert len(model.state_dict()) == FIXTURE["models"][name]["num_entries"]
    # what the launcher checks data.image_size against
    assert components.PATCH_SIZES[name] == model.patch_size == FIXTURE["models"][name]["patch_size"]


def test_vit_b_16_state_dict_keys_and_shapes_match_torchvision() -> None:
    assert layout(on_meta("vit_b_16")) == FIXTURE["vit_b_16_224_state_dict"]


@pytest.mark.parametrize("name", NAMES)
def test_every_models_layout_matches_torchvision(name: str) -> None:
    """Keys in torchvision's order: those before and after the blocks as ViT-B/16's, and every
    block's keys and shapes as torchvision's encoder_layer_0; the other shapes as torchvision's."""
    expected = FIXTURE["models"][name]
    model = on_meta(name)
    assert model.patch_size == expected["patch_size"]
    got = layout(model)
    b16 = [k for k, _ in FIXTURE["vit_b_16_224_state_dict"]]
    head = b16[: b16.index("encoder.layers.encoder_layer_0.ln_1.weight")]
    tail = b16[b16.index("encoder.ln.weight") :]
    assert head == ["class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding"]
    block = [[k.removeprefix("encoder.layers.encoder_layer_0."), s] for k, s in expected["layer_0"]]
    layers = [[f"encoder.layers.encoder_layer_{i}.{k}", s] for i in range(expected["num_layers"]) for k, s in block]
    assert [k for k, _ in got] == head + [k for k, _ in layers] + tail
    assert [e for e in got if e[0].startswith("encoder.layers.")] == layers
    shapes = dict((k, s) for k, s in got)
    assert {k: shapes[k] for k in expected["spot"]} == expected["spot"]


def test_num_classes_and_image_size_change_only_the_head_and_the_position_embedding() -> None:
    small = dict((k, s) for k, s in layout(on_meta("vit_b_16", image_size=32, num_classes=10)))
    full = dict((k, s) for k, s in FIXTURE["vit_b_16_224_state_dict"])
    changed = {k for k in full if full[k] != small[k]}
    assert changed == {"encoder.pos_embedding", "heads.head.weight", "heads.head.bias"}
    assert small["encoder.pos_embedding"] == [1, (32 // 16) ** 2 + 1, 768]
    assert small["heads.head.weight"] == [10, 768]


@pytest.fixture(scope="module")
def reference_run() -> dict[str, Any]:
    """What the fixture's recipe computes with this module's ViT-B/16 (see make_torchvision_vit.py)."""
    spec = FIXTURE["vit_b_16_32px_numerics"]
    torch.manual_seed(spec["seed"])
    model = vit.vit_b_16(image_size=32, num_classes=10)
    assert not model.heads.head.weight.any(), "torchvision starts from a zero head"
    torch.manual_seed(spec["head_seed"])
    torch.nn.init.normal_(model.heads.head.weight, std=spec["head_std"])
    torch.nn.init.normal_(model.heads.head.bias, std=spec["head_std"])
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(spec["images_seed"]))
    model.train()
    logits = model(images)
    torch.nn.functional.cross_entropy(logits, torch.tensor(spec["labels"])).backward()
    with torch.no_grad():
        features = model.encoder(torch.cat([model.class_token.expand(2, -1, -1), model._process_input(images)], 1))
    assert model.conv_proj.weight.grad is not None and model.heads.head.weight.grad is not None
    return {
        "model": model,
        "logits": logits.detach(),
        "class_token_features": features[:, 0, :8],
        "conv_proj_grad_norm": model.conv_proj.weight.grad.norm().item(),
        "head_grad_norm": model.heads.head.weight.grad.norm().item(),
    }


def test_forward_at_32_px_gives_batch_by_classes(reference_run: dict[str, Any]) -> None:
    assert reference_run["logits"].shape == (2, 10)
    assert torch.isfinite(reference_run["logits"]).all()


def test_numerics_match_torchvision_from_the_same_seed(reference_run: dict[str, Any]) -> None:
    # built in torchvision's order with its initialisations, the model draws the same numbers: the
    # same weights, so the same logits, features and gradients (fp32; other CPUs' kernels may
    # differ in the last bits)
    spec = FIXTURE["vit_b_16_32px_numerics"]
    for key in ("logits", "class_token_features"):
        torch.testing.assert_close(reference_run[key], torch.tensor(spec[key]), rtol=1e-4, atol=1e-4)
    for key in ("conv_proj_grad_norm", "head_grad_norm"):
        assert math.isclose(reference_run[key], spec[key], rel_tol=1e-4), key


def test_each_encoder_layer_is_a_block_fsdp_and_checkpointing_take() -> None:
    model = on_meta("vit_b_16", image_size=32)
    assert vit.BLOCKS == (vit.EncoderBlock,)
    blocks = [m for m in model.modules() if isinstance(m, vit.BLOCKS)]
    assert blocks == list(model.encoder.layers) and len(blocks) == 12


def test_a_torchvision_checkpoint_of_the_old_mlp_naming_loads() -> None:
    # torchvision < 0.14 named the MLP's layers linear_1 / linear_2 (MLPBlock version 1); torchvision
    # renames them on load, and so does this module
    torch.manual_seed(0)
    src = vit.VisionTransformer(8, 4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3)
    state = src.state_dict()
    renamed = ((k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."), v) for k, v in state.items())
    old = type(state)(renamed)
    old._metadata = {k: {**v, "version": 1} if k.endswith("mlp") else v for k, v in state._metadata.items()}  # type: ignore[attr-defined]
    dst = vit.VisionTransformer(8, 4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3)
    dst.load_state_dict(old, strict=True)
    for key, value in dst.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_an_image_size_that_is_not_a_multiple_of_the_patch_is_refused() -> None:
    with pytest.raises(ValueError, match="image_size 30 is not a positive multiple of patch_size 16"):
        vit.vit_b_16(image_size=30)
    # the registered factory builds for the data's image size, and checks it first
    build = next(r.factory for r in components.models() if r.name == "vit_h_14")
    config = components.ViTConfig()
    with pytest.raises(ddlkit.ConfigError) as err:
        build(config, ddlkit.DataInfo(num_classes=10, image_size=30, train_length=8, val_length=0))
    assert str(err.value) == (
        "data.image_size=30 is not a multiple of model=vit_h_14's patch size 14: set data.image_size=28 or 42, "
        "for example."
    )
    with pytest.raises(ddlkit.ConfigError, match=r"model=vit_h_14 takes images.*data.image_size=0"):
        build(config, ddlkit.DataInfo(num_classes=10, image_size=0, train_length=8, val_length=0))
    with torch.device("meta"):
        model = build(config, ddlkit.DataInfo(num_classes=7, image_size=28, train_length=8, val_length=0))
    assert (model.image_size, model.patch_size, model.num_classes) == (28, 14, 7)


def test_the_cli_refuses_the_image_size_in_one_line_before_the_job_starts(run_factory: RunFactory) -> None:
    out = run_factory("framework=pytorch", "model=vit_b_16", "data.image_size=30")
    out.assert_one_line_error("data.image_size=30 is not a multiple of model=vit_b_16's patch size 16")
    assert not out.job_dir.exists()


#: the recipe preset, made tiny: 2 steps of 16 at 32 px
TINY = [
    "framework=pytorch",
    "+experiment=vit_b16_imagenet",
    "data=synthetic",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=32",
    "data.val_length=16",
    "trainer.epochs=1",
    "trainer.batch_size=16",
    "trainer.precision=fp32",
    "trainer.save_model=false",
    "framework.num_threads=1",
]


@pytest.mark.slow
def test_the_recipe_preset_trains_vit_b_16_through_the_cli(run_factory: RunFactory) -> None:
    out = run_factory(*TINY, env={"DDLKIT_EXPERIMENTS": str(EXPERIMENTS)}, timeout=300).assert_success()
    result = out.result
    assert (result["status"], result["model"], result["steps"], result["global_batch_size"]) == (
        "completed",
        "vit_b_16",
        2,
        16,
    )
    assert math.isfinite(result["final_loss"])
    # the recipe's AdamW rate is for a global batch of 4096, scaled by the square root
    assert result["peak_lr"] == pytest.approx(0.003 * math.sqrt(16 / 4096))
    assert result["clip_grad_norm"] == 1.0
    config = (out.job_dir / "config.yaml").read_text()
    for line in ("name: adamw", "weight_decay: 0.3", "label_smoothing: 0.11", "name: vit_b_16"):
        assert line in config, line


@pytest.mark.slow
def test_the_recipe_trains_on_an_image_folder_at_224_px(run_factory: RunFactory, tmp_path: Path) -> None:
    from ddlkit.testing.images import make_image_dataset

    data = make_image_dataset(tmp_path / "imagenet", classes=3, train_per_class=2, val_per_class=1)
    out = run_factory(
        "framework=pytorch",
        "+experiment=vit_b16_imagenet",
        f"data.root={data.root}",
        "data.workers=1",
        "trainer.batch_size=2",
        "trainer.max_steps=1",
        "trainer.validate=false",
        "trainer.precision=fp32",  # bf16 is emulated on CPUs without it: 100 s for this step here
        "trainer.save_model=false",
        "framework.num_threads=1",
        env={"DDLKIT_EXPERIMENTS": str(EXPERIMENTS)},
        timeout=300,
    ).assert_success()
    assert (out.result["model"], out.result["data"], out.result["steps"]) == ("vit_b_16", "imagefolder", 1)
    assert math.isfinite(out.result["final_loss"])
