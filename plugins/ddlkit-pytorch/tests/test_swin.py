"""ddlkit_pytorch.swin reproduces torchvision's Swin Transformers (version 1), and ``model=swin_t``
trains through the CLI. The expected values come from torchvision 0.28's own
``models/swin_transformer.py``, written once into ``data/torchvision_vit.json`` (see
``data/make_torchvision_vit.py``); torchvision is not imported here."""

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

from ddlkit_pytorch import components, swin  # noqa: E402

FIXTURE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "torchvision_vit.json").read_text())

#: torchvision's documented parameter counts (1000 classes)
TORCHVISION_NUM_PARAMS = {"swin_t": 28_288_354, "swin_b": 87_768_224}
NAMES = list(TORCHVISION_NUM_PARAMS)


def on_meta(name: str, **kwargs: Any) -> Any:
    with torch.device("meta"):
        return swin.MODELS[name](**kwargs)


def layout(model: Any) -> list[list[Any]]:
    return [[key, list(t.shape)] for key, t in model.state_dict().items()]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_and_entries_match_torchvision(name: str) -> None:
    expected = FIXTURE["models"][name]
    assert expected["num_params"] == TORCHVISION_NUM_PARAMS[name]
    model = on_meta(name)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_NUM_PARAMS[name]
    got = dict((k, s) for k, s in layout(model))
    assert len(got) == expected["num_entries"]
    assert {k: got[k] for k in expected["spot"]} == expected["spot"]


def test_swin_t_state_dict_keys_and_shapes_match_torchvision() -> None:
    assert layout(on_meta("swin_t")) == FIXTURE["swin_t_state_dict"]


def test_numerics_match_torchvision_from_the_same_seed() -> None:
    spec = FIXTURE["swin_t_32px_numerics"]
    torch.manual_seed(spec["seed"])
    model = swin.swin_t(num_classes=10)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(spec["images_seed"]))
    model.train()
    torch.manual_seed(spec["stochastic_depth_seed"])  # the blocks drawn as torchvision draws them
    train_logits = model(images)
    torch.nn.functional.cross_entropy(train_logits, torch.tensor(spec["labels"])).backward()
    model.eval()
    with torch.no_grad():
        eval_logits = model(images)
    assert eval_logits.shape == (2, 10)
    assert not torch.allclose(train_logits, eval_logits), "stochastic depth dropped no branch"
    torch.testing.assert_close(train_logits.detach(), torch.tensor(spec["train_logits"]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(eval_logits, torch.tensor(spec["eval_logits"]), rtol=1e-4, atol=1e-4)
    grad = model.features[0][0].weight.grad
    assert math.isclose(grad.norm().item(), spec["patch_embed_grad_norm"], rel_tol=1e-4)


@pytest.mark.parametrize("size", [4, 32, 61])
def test_any_image_size_of_a_patch_or_more(size: int) -> None:
    # no position embedding of a fixed length: maps are padded to whole windows
    torch.manual_seed(0)
    model = swin.swin_t(num_classes=5).eval()
    with torch.no_grad():
        y = model(torch.randn(2, 3, size, size))
    assert y.shape == (2, 5) and torch.isfinite(y).all()


def test_each_block_is_a_unit_fsdp_and_checkpointing_take() -> None:
    model = on_meta("swin_b")
    assert swin.BLOCKS == (swin.SwinTransformerBlock,)
    blocks = [m for m in model.modules() if isinstance(m, swin.BLOCKS)]
    assert len(blocks) == 2 + 2 + 18 + 2
    # torchvision's stochastic depth: 0 at the first block, the model's rate (0.5) at the last
    assert (blocks[0].stochastic_depth.p, blocks[-1].stochastic_depth.p) == (0.0, 0.5)


def test_the_schemas_default_to_torchvisions_stochastic_depth() -> None:
    schemas = {r.name: r.config for r in components.models() if r.name in NAMES}
    assert {name: schema().stochastic_depth_prob for name, schema in schemas.items()} == {"swin_t": 0.2, "swin_b": 0.5}


def test_an_image_smaller_than_a_patch_or_no_image_is_refused() -> None:
    build = next(r.factory for r in components.models() if r.name == "swin_t")
    config = components.SwinTConfig()
    with pytest.raises(ddlkit.ConfigError) as err:
        build(config, ddlkit.DataInfo(num_classes=10, image_size=3, train_length=8, val_length=0))
    assert str(err.value) == (
        "data.image_size=3 is smaller than model=swin_t's patch size 4: set data.image_size=4 or more."
    )
    with pytest.raises(ddlkit.ConfigError, match=r"model=swin_t takes images.*data.image_size=0"):
        build(config, ddlkit.DataInfo(num_classes=10, image_size=0, train_length=8, val_length=0))
    with torch.device("meta"):
        model = build(config, ddlkit.DataInfo(num_classes=7, image_size=30, train_length=8, val_length=0))
    assert model.head.out_features == 7


@pytest.mark.slow
def test_swin_t_trains_through_the_cli(run_factory: RunFactory) -> None:
    out = run_factory(
        "framework=pytorch",
        "model=swin_t",
        "optimizer=adamw",
        "data.image_size=32",
        "data.num_classes=10",
        "data.length=32",
        "data.val_length=16",
        "trainer.epochs=1",
        "trainer.batch_size=16",
        "trainer.save_model=false",
        "framework.num_threads=1",
        timeout=300,
    ).assert_success()
    result = out.result
    assert (result["status"], result["model"], result["steps"]) == ("completed", "swin_t", 2)
    assert math.isfinite(result["final_loss"])
    assert "stochastic_depth_prob: 0.2" in (out.job_dir / "config.yaml").read_text()
