"""A completed run's results: ``result.json`` (one key per row of :data:`ddlkit.result.FIELDS`,
in its order, after the keys plugins add through ``run.extra_result``), written by rank 0 into
the job directory and published by the storage backend under the job's name."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import write_json
from ..checkpoint import BEST, CHECKPOINT_DIR
from ..interfaces import StorageBackend
from ..jobdir import RESULT_FILE

if TYPE_CHECKING:
    from .run import Run


def result_of(run: Run, status: str) -> dict[str, Any]:
    """The content of result.json for ``run`` ended with ``status``."""
    t = run.cfg.trainer
    early, best = run.early_stopping, run.best
    return {
        **run.extra_result,
        "status": status,
        "framework": run.cfg.framework.name,
        "model": run.cfg.model.name,
        "data": run.cfg.data.name,
        "world_size": run.dist.world_size,
        "batch_size_per_rank": t.batch_size,
        "global_batch_size": run.global_batch,
        "precision": str(t.precision),
        "device": run.device,
        "epochs": run.state.epoch,
        "steps": run.state.step,
        "steps_per_epoch": run.steps_per_epoch,
        "images_per_sec": round(run.meter.images_per_sec, 3),
        "measured_steps": run.meter.measured_steps,
        "warmup_steps": t.warmup_steps,
        "final_loss": run.last_loss,
        "val_loss": run.epoch_metrics.get("val_loss"),
        "top1": run.epoch_metrics.get("val_top1"),
        "top5": run.epoch_metrics.get("val_top5"),
        "best_top1": run.best_top1,
        "peak_lr": run.schedule.peak_lr,
        "wall_time_s": round(time.time() - run.started, 3),
        "resumed_from_step": run.resumed_at.step if run.resumed_at else None,
        "accumulate_batches": run.accumulate,
        "clip_grad_norm": t.clip_grad_norm or None,
        # why the run ended before its last epoch, or None
        "stopped_early": ({"monitor": early.monitor, "reason": early.reason,
                           "epoch": run.state.epoch, "step": run.state.step}
                          if run.stopped_early else None),
        "best_checkpoint": ({"monitor": best.monitor, "mode": best.mode, "value": best.best,
                             "step": best.best_step, "epoch": best.best_epoch, "path": f"{CHECKPOINT_DIR}/{BEST}"}
                            if best is not None and best.best is not None else None),
    }


def keep_results(result: dict[str, Any], job_dir: Path, storage: StorageBackend, name: str) -> None:
    """Write ``result`` as the job directory's result.json, then have ``storage`` publish the
    job's results under ``name`` (rank 0, once, at the end of a completed run)."""
    write_json(job_dir / RESULT_FILE, result)
    where = storage.publish_results(job_dir, name)
    if where:
        print(f"ddlkit: results published to {where}", flush=True)
