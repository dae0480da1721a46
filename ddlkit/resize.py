"""What a job does with its batch and learning rate when it runs on another world size than planned
(an elastic job restarted on the nodes that remain, ``compute.min_nodes``; or grown back): the
one rule the launcher prints before the restart and the ranks apply, ``trainer.on_resize``:

* ``keep_global_batch`` (the default): the global batch (``trainer.batch_size`` x planned ranks x
  ``trainer.accumulate_batches``) stays, so the optimisation is unchanged -- the same learning
  rate, the same steps per epoch, and each optimizer step reads the same images as it would have
  on the planned ranks (:mod:`ddlkit.images` orders an epoch by global batch, whatever the world
  size). Each rank takes more images per step: its micro-batch grows up to
  ``trainer.max_batch_size`` (null: ``trainer.batch_size``, which is known to fit), and gradient
  accumulation makes up the rest;
* ``scale_lr``: each rank keeps its batch, so the global batch changes with the world size, and
  the learning rate follows it by ``optimizer.scale_lr`` (Goyal et al.'s linear rule for SGD), as
  for any global batch (:class:`ddlkit.optim.LRScaling`). The epoch's position is kept in images: a
  run resumed mid-epoch goes on at the image it stopped at. Where that image is not at a step
  boundary of the new global batch, the ranks keep the checkpoint's global batch instead (as
  ``keep_global_batch`` does), so that no image of the epoch is skipped or seen twice.

Pure Python: the launcher imports it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .optim import LRScaling

#: trainer.on_resize
ON_RESIZE = ("keep_global_batch", "scale_lr")
#: the world size the job's batch settings were planned for, when the ranks run on another one
PLANNED_WORLD_SIZE_ENV = "DDLKIT_PLANNED_WORLD_SIZE"


@dataclass(frozen=True)
class BatchPlan:
    """The per-rank batch and accumulation a job trains with on ``world_size`` ranks."""

    world_size: int
    batch_size: int
    accumulate: int
    #: why the plan departs from ``trainer.on_resize`` (empty when it does not)
    note: str = ""

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size * self.accumulate

    def per_rank(self) -> str:
        """The per-rank batch in words: ``32``, or ``16 x 2 micro-batches``."""
        return f"{self.batch_size}" + (f" x {self.accumulate} micro-batches" if self.accumulate > 1 else "")


def keep_global_batch(trainer: Any, global_batch: int, world_size: int) -> BatchPlan:
    """The per-rank micro-batch and accumulation that make ``global_batch`` on ``world_size`` ranks:
    the micro-batch as large as ``trainer.max_batch_size`` allows (null: ``trainer.batch_size``),
    and the fewest micro-batches that divide the rank's share evenly."""
    if global_batch % world_size:
        raise ConfigError(
            f"trainer.on_resize=keep_global_batch cannot keep the global batch of {global_batch} on {world_size} "
            f"ranks ({global_batch} / {world_size} is no whole batch). Choose a trainer.batch_size whose global "
            "batch divides by every world size from compute.min_nodes to compute.nodes, or trainer.on_resize=scale_lr."
        )
    share = global_batch // world_size
    cap = trainer.max_batch_size or trainer.batch_size
    accumulate = math.ceil(share / cap)
    while share % accumulate:
        accumulate += 1
    return BatchPlan(world_size, share // accumulate, accumulate)


def plan_batch(
    trainer: Any,
    planned_world: int,
    world_size: int,
    *,
    resumed_global_batch: int | None = None,
    resumed_batch: int = 0,
) -> BatchPlan:
    """The batch a job trains with on ``world_size`` ranks when ``trainer`` was planned for
    ``planned_world``; ``resumed_*``: the global batch of the checkpoint it resumes from and the
    optimizer steps of its epoch that checkpoint had taken (its position in images)."""
    planned = BatchPlan(planned_world, trainer.batch_size, trainer.accumulate_batches)
    if trainer.on_resize == "keep_global_batch":
        if world_size == planned_world:
            return planned
        return keep_global_batch(trainer, planned.global_batch, world_size)
    plan = BatchPlan(world_size, trainer.batch_size, trainer.accumulate_batches)
    if resumed_global_batch and (resumed_batch * resumed_global_batch) % plan.global_batch:
        # the epoch stopped between two steps of the new global batch: keep the checkpoint's
        kept = keep_global_batch(trainer, resumed_global_batch, world_size)
        return BatchPlan(
            world_size,
            kept.batch_size,
            kept.accumulate,
            note=(
                f"the checkpoint stopped {resumed_batch * resumed_global_batch} images into its epoch, not at a step "
                "of "
                f"the new global batch of {plan.global_batch}: keeping its global batch of {resumed_global_batch}"
            ),
        )
    return plan


def describe(before: BatchPlan, after: BatchPlan, optimizer: Any, on_resize: str) -> str:
    """``trainer.on_resize=keep_global_batch: per-rank batch 16 -> 32, lr unchanged``: what a change
    of world size does to the batch and the learning rate."""

    def peak(plan: BatchPlan) -> float:
        return LRScaling(optimizer.scale_lr).peak_lr(optimizer.lr, plan.global_batch, optimizer.reference_batch)

    batch = (
        f"per-rank batch {before.per_rank()} -> {after.per_rank()}"
        if before.per_rank() != after.per_rank()
        else f"per-rank batch {after.per_rank()}"
    )
    if before.global_batch != after.global_batch:
        batch += f", global batch {before.global_batch} -> {after.global_batch}"
    lr_before, lr_after = peak(before), peak(after)
    lr = (
        f"lr {lr_before:g} -> {lr_after:g} (optimizer.scale_lr={optimizer.scale_lr})"
        if lr_before != lr_after
        else "lr unchanged"
    )
    note = f" ({after.note})" if after.note else ""
    return f"trainer.on_resize={on_resize}: {batch}, {lr}{note}"
