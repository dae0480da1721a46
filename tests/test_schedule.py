"""The learning-rate rule of Goyal et al.: linear scaling, linear warm-up, step decay."""

from __future__ import annotations

import pytest

from ddlkit import LRSchedule
from ddlkit.optim import LRScaling
from ddlkit.testing import add_plugin, make_run


def test_peak_scales_linearly_with_the_global_batch() -> None:
    assert LRSchedule(0.1, global_batch=256, steps_per_epoch=10).peak_lr == pytest.approx(0.1)
    assert LRSchedule(0.1, global_batch=8192, steps_per_epoch=10).peak_lr == pytest.approx(3.2)
    assert LRSchedule(0.1, global_batch=64, steps_per_epoch=10, reference_batch=32).peak_lr == pytest.approx(0.2)
    assert LRSchedule(0.1, global_batch=8192, steps_per_epoch=10, scale_lr="none").peak_lr == pytest.approx(0.1)


def test_square_root_scaling() -> None:
    assert LRSchedule(0.001, global_batch=1024, steps_per_epoch=10, scale_lr="sqrt").peak_lr == pytest.approx(0.002)
    assert LRSchedule(0.001, global_batch=64, steps_per_epoch=10, scale_lr=LRScaling.sqrt).peak_lr == pytest.approx(
        0.0005
    )


@pytest.mark.parametrize(
    ("optimizer", "rule", "peak"),
    [
        ("sgd", "linear", 0.1 * 32 / 256),
        ("lars", "linear", 0.1 * 32 / 256),
        ("adamw", "sqrt", 0.001 * (32 / 256) ** 0.5),
        ("lamb", "sqrt", 0.004 * (32 / 256) ** 0.5),
    ],
)
@pytest.mark.plugins  # the optimizers are ddlkit-pytorch's
def test_each_optimizer_scales_by_its_own_rule(ddlkit_pm, tmp_path, optimizer: str, rule: str, peak: float) -> None:
    """Issue 22, item 5: adamw at batch 32 trained at 0.001 x 32/256 = 0.000125, SGD's linear rule."""
    from ddlkit_pytorch import plugin

    add_plugin(ddlkit_pm, plugin)  # the optimizers' registrations
    run = make_run(ddlkit_pm, tmp_path, "framework=pytorch", f"optimizer={optimizer}", "trainer.batch_size=32")
    assert (run.schedule.scaling.value, run.schedule.peak_lr) == (rule, pytest.approx(peak))
    unscaled = make_run(
        ddlkit_pm,
        tmp_path / "none",
        "framework=pytorch",
        f"optimizer={optimizer}",
        "trainer.batch_size=32",
        "optimizer.scale_lr=none",
    )
    assert unscaled.schedule.peak_lr == pytest.approx(run.schedule.base_lr)


def test_warmup_rises_linearly_to_the_peak() -> None:
    s = LRSchedule(0.1, global_batch=512, steps_per_epoch=10, warmup_epochs=2, decay_epochs=())
    peak = 0.2
    assert [s(i) for i in (0, 1, 9, 19)] == pytest.approx([peak / 20, 2 * peak / 20, peak / 2, peak])
    assert s(20) == pytest.approx(peak) and s(1000) == pytest.approx(peak)
    rises = [s(i + 1) - s(i) for i in range(19)]
    assert rises == pytest.approx([peak / 20] * 19)


def test_fractional_and_no_warmup() -> None:
    half = LRSchedule(0.1, global_batch=256, steps_per_epoch=10, warmup_epochs=0.5, decay_epochs=())
    assert [half(i) for i in (0, 4, 5)] == pytest.approx([0.02, 0.1, 0.1])
    none = LRSchedule(0.1, global_batch=256, steps_per_epoch=10, warmup_epochs=0, decay_epochs=())
    assert none(0) == pytest.approx(0.1)


def test_decays_by_the_factor_at_each_decay_epoch() -> None:
    s = LRSchedule(0.1, global_batch=256, steps_per_epoch=100, warmup_epochs=1, decay_epochs=(5, 3), decay_factor=0.1)
    assert [s(i) for i in (299, 300, 499, 500, 10_000)] == pytest.approx([0.1, 0.01, 0.01, 0.001, 0.001])


def test_the_goyal_imagenet_schedule() -> None:
    """8k images per step: 32 x 256 ranks, 5 warm-up epochs, decays at 30/60/80 of 90 epochs."""
    steps = 1_281_167 // 8192
    s = LRSchedule(0.1, global_batch=8192, steps_per_epoch=steps)
    assert s.peak_lr == pytest.approx(3.2)
    assert s(5 * steps - 1) == pytest.approx(3.2)
    assert s(30 * steps) == pytest.approx(0.32)
    assert s(60 * steps) == pytest.approx(0.032)
    assert s(89 * steps) == pytest.approx(0.0032)
