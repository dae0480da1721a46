"""trainer.on_resize (ddlkit.resize): the batch and learning rate of a job on another world size than
planned, and why keeping the global batch resumes exactly (the epoch's order by global batch)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from ddlkit.config import TrainerConfig
from ddlkit.errors import ConfigError
from ddlkit.images import epoch_order
from ddlkit.interfaces import Shard
from ddlkit.optim import SGDConfig
from ddlkit.resize import BatchPlan, describe, plan_batch


def trainer(**options: object) -> object:
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), options)


def test_keep_global_batch_accumulates_by_default_and_grows_the_batch_up_to_max_batch_size() -> None:
    # 16 per rank on 8 ranks = 128; on 2 ranks each takes 64
    assert plan_batch(trainer(batch_size=16), 8, 2) == BatchPlan(2, 16, 4)
    assert plan_batch(trainer(batch_size=16, max_batch_size=32), 8, 2) == BatchPlan(2, 32, 2)
    assert plan_batch(trainer(batch_size=16, max_batch_size=100), 8, 2) == BatchPlan(2, 64, 1)
    # the fewest micro-batches that split the share evenly: 48 = 3 x 16 rather than 2 x 24 above the cap
    assert plan_batch(trainer(batch_size=16, max_batch_size=20), 6, 2) == BatchPlan(2, 16, 3)
    # grown back: the planned batch again
    assert plan_batch(trainer(batch_size=16, accumulate_batches=2), 8, 8) == BatchPlan(8, 16, 2)


def test_keep_global_batch_refuses_a_global_batch_that_does_not_split() -> None:
    with pytest.raises(
        ConfigError, match=r"cannot keep the global batch of 30 on 4 ranks .*trainer.on_resize=scale_lr"
    ):
        plan_batch(trainer(batch_size=5), 6, 4)


def test_scale_lr_keeps_the_per_rank_batch_unless_the_position_is_between_two_of_its_steps() -> None:
    t = trainer(batch_size=8, on_resize="scale_lr")
    assert plan_batch(t, 4, 2) == BatchPlan(2, 8, 1)
    # shrunk: 3 steps of 32 = 96 images = 6 steps of 16
    assert plan_batch(t, 4, 2, resumed_global_batch=32, resumed_batch=3) == BatchPlan(2, 8, 1)
    # grown back: 3 steps of 16 = 48 images is no whole step of 32, so the checkpoint's global batch stays
    kept = plan_batch(t, 4, 4, resumed_global_batch=16, resumed_batch=3)
    assert (kept.batch_size, kept.accumulate, kept.global_batch) == (4, 1, 16)
    assert "keeping its global batch of 16" in kept.note
    assert plan_batch(t, 4, 4, resumed_global_batch=16, resumed_batch=4) == BatchPlan(4, 8, 1)


def test_the_change_is_described_with_its_learning_rate() -> None:
    sgd = OmegaConf.structured(SGDConfig(lr=0.1))
    assert describe(BatchPlan(4, 16, 1), BatchPlan(2, 16, 2), sgd, "keep_global_batch") == (
        "trainer.on_resize=keep_global_batch: per-rank batch 16 -> 16 x 2 micro-batches, lr unchanged"
    )
    assert describe(BatchPlan(4, 16, 1), BatchPlan(2, 16, 1), sgd, "scale_lr") == (
        "trainer.on_resize=scale_lr: per-rank batch 16, global batch 64 -> 32, lr 0.025 -> 0.0125 "
        "(optimizer.scale_lr=linear)"
    )


@pytest.mark.parametrize(("world", "batch", "accumulate"), [(4, 8, 1), (2, 8, 2), (2, 16, 1), (1, 8, 4)])
def test_an_optimizer_step_reads_the_same_images_whatever_the_ranks_that_share_its_global_batch(
    world: int, batch: int, accumulate: int
) -> None:
    """What makes keep_global_batch exact: step k of an epoch is the images perm[k*G:(k+1)*G]."""
    n, global_batch = 200, 32
    perm = np.random.default_rng([7, 3]).permutation(n)
    orders = [
        epoch_order(n, batch_size=batch, shard=Shard(rank, world), seed=7, epoch=3, train=True) for rank in range(world)
    ]
    for k in range(n // global_batch):
        share = batch * accumulate
        step = np.concatenate([order[k * share : (k + 1) * share] for order in orders])
        assert sorted(step) == sorted(perm[k * global_batch : (k + 1) * global_batch])
