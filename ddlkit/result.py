"""The fields of ``result.json``: one table, from which every reader of a result takes its keys.

:meth:`ddlkit.Run.result` writes one key per :data:`FIELDS` row (``tests/test_result.py`` fails
when the two differ), whatever the framework: every framework plugin's ``FrameworkContract``
(``ddlkit.testing.contracts``) fails when its run's ``result.json`` lacks a field of the table,
leaves one of :data:`FRAMEWORK` null, or has a key its plugin does not declare. Plugins add keys
of their own through ``run.extra_result`` (PyTorch: ``device_name``, ``loss_scale``,
and with ``data=imagefolder`` ``decoder`` and the counts of GPU- and CPU-decoded images). The
views below choose fields of the table, in the order their readers show them: the sweep's
ledger and objectives, the sweep report's columns and its line per finished job, ``ddlkit jobs
status`` and the console logger's end-of-run table. Nothing else spells a result key.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a larger value is better (sweep objectives, report sorting)
MAXIMIZE = "maximize"
#: a smaller value is better
MINIMIZE = "minimize"


@dataclass(frozen=True)
class Field:
    name: str
    #: the type of the value when present; every field may be null (not measured, not applicable)
    type: type
    #: MAXIMIZE, MINIMIZE, or None for a field that is no measure of how good a run was
    direction: str | None
    #: how a report shows the value
    format: str = "{}"
    #: how a report titles the value; by default its name, in words
    title: str = ""

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.name.replace("_", " "))


#: in the order Run.result writes them
FIELDS: tuple[Field, ...] = (
    #: "completed": rank 0 writes result.json only when training completed
    Field("status", str, None),
    #: the selected framework's name (framework=)
    Field("framework", str, None),
    #: the selected model's name (model=)
    Field("model", str, None),
    #: the selected data source's name (data=)
    Field("data", str, None),
    #: the ranks the job ran on (an elastic job's actual number: see resize)
    Field("world_size", int, None),
    #: trainer.batch_size: images per rank per micro-batch
    Field("batch_size_per_rank", int, None),
    #: images per optimizer step: batch_size_per_rank x world_size x accumulate_batches
    Field("global_batch_size", int, None),
    #: trainer.precision: fp32, bf16 or fp16
    Field("precision", str, None),
    #: where rank 0 computed, as its framework set ``run.device``: "cpu", or "cuda:<index>" for a
    #: GPU (its index among the GPUs the rank sees; torch's name, also for TensorFlow's GPUs);
    #: several, comma-separated, where a rank replicates over several GPUs (TensorFlow's strategy
    #: uses every GPU its worker sees)
    Field("device", str, None),
    #: the most memory a rank held in this attempt, the largest over the ranks, in MiB (ddlkit.rank.memory):
    #: on a GPU the peak its framework allocated there (run.device_peak_memory_mib), else the peak resident
    #: set size of the rank's process (not counting the data-loading workers it starts)
    Field("peak_memory_mib", float, MINIMIZE, "{:.1f}", "peak memory (MiB)"),
    #: which memory peak_memory_mib is: "device" where every rank's framework reported its GPU's, else "rss"
    Field("peak_memory", str, None),
    #: epochs completed
    Field("epochs", int, None),
    #: optimizer steps taken since the start of training (across resumes)
    Field("steps", int, None),
    #: optimizer steps per epoch: the training images divided by the global batch
    Field("steps_per_epoch", int, None),
    #: training images per second over the measured steps (the global batch's, all ranks together):
    #: warm-up steps excluded, and the time of validation and checkpoints cut out, as tf_cnn_benchmarks counts
    Field("images_per_sec", float, MAXIMIZE, "{:.1f}", "images/sec"),
    #: the steps images_per_sec was measured over
    Field("measured_steps", int, None),
    #: the steps at the start that images_per_sec leaves out (trainer.warmup_steps)
    Field("warmup_steps", int, None),
    #: the training loss at the last logged step (the mean over the ranks)
    Field("final_loss", float, MINIMIZE, "{:.4f}", "final loss"),
    #: the last validation's loss (the mean over the ranks); null without validation
    Field("val_loss", float, MINIMIZE, "{:.4f}", "val loss"),
    #: the last validation's top-1 accuracy, a fraction (the mean over the ranks); null without validation
    Field("top1", float, MAXIMIZE, "{:.4f}", "val top-1"),
    #: the last validation's top-5 accuracy, a fraction (the mean over the ranks); null without validation
    Field("top5", float, MAXIMIZE, "{:.4f}", "val top-5"),
    #: the best validation top-1 accuracy of the run (across resumes)
    Field("best_top1", float, MAXIMIZE, "{:.4f}", "best val top-1"),
    #: the learning rate after warm-up: optimizer.lr scaled to the global batch by optimizer.scale_lr
    Field("peak_lr", float, None, "{:.4g}"),
    #: seconds from rank 0's start to the end of training, this attempt only (a resumed job's earlier
    #: attempts are not counted)
    Field("wall_time_s", float, MINIMIZE, "{:.1f}", "wall time (s)"),
    #: the step of the checkpoint this attempt resumed from; null for a fresh start
    Field("resumed_from_step", int, None),
    #: how often the launcher restarted the job after the infrastructure ended it, and the optimizer
    #: steps those ends cost (trained again from the checkpoint before each): ddlkit.compute.restarts
    Field("restarts", int, None),
    Field("steps_lost", int, None),
    #: micro-batches per optimizer step (trainer.accumulate_batches, or what an elastic resize chose)
    Field("accumulate_batches", int, None),
    #: the job ran on another world size than planned (an elastic restart, compute.min_nodes):
    #: planned_world_size, world_size, on_resize, the planned per-rank batch, description
    Field("resize", dict, None),
    #: the global gradient norm clipped to (trainer.clip_grad_norm); null: no clipping
    Field("clip_grad_norm", float, None, "{:.4g}"),
    #: why the run ended before its last epoch: monitor, reason, epoch, step
    Field("stopped_early", dict, None),
    #: rank 0's start-up: ``started_at`` (Unix time its process started), then each phase it reached
    #: (worker started, ranks connected, plugins loaded, framework imported, model built, data
    #: ready, first step done) in seconds since then: where the time to the first step went
    Field("startup_s", dict, None),
    #: the best checkpoint kept: monitor, mode, value, step, epoch, path
    Field("best_checkpoint", dict, None),
    #: the ranks named slower than the others (dist.straggler_factor), one entry per episode: rank, node,
    #: since and until (steps; until null: to the end), slower_pct, and the phase that made the difference
    #: with its share of the rank's own time per step and the others' share (phase_share, others_share)
    Field("stragglers", list, None),
    #: how long the checkpoints taken while training went on held rank 0's training thread: checkpoints,
    #: background (whether they were written by a thread: trainer.checkpoint_async), median, max and
    #: total seconds; a background write's copy of the state, or the whole write
    Field("checkpoint_stall_s", dict, None),
)
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
NAMES: frozenset[str] = frozenset(BY_NAME)


def _view(*names: str) -> tuple[Field, ...]:
    return tuple(BY_NAME[name] for name in names)  # a KeyError at import names a field the table lacks


#: what a finished job is summed up by: the sweep report's result columns, its line per job
HEADLINE = _view("images_per_sec", "final_loss", "best_top1")
#: what the sweep's ledger keeps of each job's result, and what ``sweep.objective`` may name
LEDGER = HEADLINE + _view(
    "top1", "top5", "val_loss", "steps", "epochs", "world_size", "global_batch_size", "wall_time_s"
)
#: what the framework reports through the Run, which a completed run never leaves null
FRAMEWORK = _view("device")
#: what ``ddlkit jobs status`` shows of an ended job's result
STATUS = _view("steps") + HEADLINE
#: the console logger's table at the end of a completed run
SUMMARY = _view(
    "framework",
    "model",
    "world_size",
    "global_batch_size",
    "epochs",
    "steps",
    "images_per_sec",
    "final_loss",
    "top1",
    "top5",
    "wall_time_s",
)
