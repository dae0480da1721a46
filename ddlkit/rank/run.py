"""The rank-side state of a job, handed to the framework, the loggers and every lifecycle hook.

A framework's loop talks only to this object (see :class:`ddlkit.Framework`), so the rules
shared by all frameworks live here once: the learning-rate schedule, throughput measurement,
when to log, when to checkpoint, when to stop. What it hands on has a module each: the epoch
loop it runs for a framework (:mod:`.loop`), the checkpoint files, written atomically on rank 0
only (:mod:`.checkpointing`), stopping on SIGTERM (:mod:`.preemption`), result.json and
publishing it (:mod:`.results`), the start-up phases (:mod:`.phases`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import replace_text
from ..callbacks import CallbackPlugin
from ..callbacks import load as load_callbacks
from ..checkpoint import BEST, CHECKPOINT_DIR
from ..config import check_one_global_batch
from ..custom import launch_dir
from ..errors import DdlkitError, RunError
from ..interfaces import DataSource, Framework, Loader, Logger, RunState, Shard, StorageBackend
from ..interfaces.data import Split
from ..interfaces.run import LoadFn, SaveFn, SnapshotFn
from ..jobdir import RESTARTS_ENV, STEPS_LOST_ENV, TELEMETRY_FILE
from ..monitor import EarlyStopping, Watch
from ..resize import PLANNED_WORLD_SIZE_ENV, BatchPlan, describe, plan_batch
from . import loop
from .checkpointing import CheckpointKeeper, check_compatible, saved_position
from .memory import peak_over_ranks
from .phases import record_phase, report_phase, startup
from .preemption import Preempted, StopRequest
from .profiling import ProfileWindow
from .results import keep_results
from .schedule import LRSchedule
from .telemetry import HOST, TELEMETRY_EVERY_S, StepTelemetry, StragglerWatch, rank_table
from .throughput import ThroughputMeter

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..plugins import DdlkitPluginManager
    from ..registry import Registry
    from .distributed import DistContext


class Run:
    """The rank's run. What plugins and hooks may use of it is :class:`ddlkit.RunContext`; the
    rest (the meter, checkpoint bookkeeping, signal handling, result.json) is the worker's."""

    def __init__(
        self,
        cfg: DictConfig,
        job_dir: Path,
        *,
        pm: DdlkitPluginManager,
        registry: Registry,
        dist: DistContext,
        resume_from: Path | None = None,
        name: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.job_dir = Path(job_dir)
        #: the job's name (unique per job; results are published under it)
        self.name = name or self.job_dir.name
        self.pm = pm
        self.hook = pm.hook
        self.registry = registry
        self.dist = dist
        self.storage: StorageBackend = registry.create("storage", cfg.storage.name, cfg.storage)
        _data_root_as_read_here(cfg, self.storage)
        self.data: DataSource = registry.create("data", cfg.data.name, cfg.data)
        self.framework: Framework = registry.create("framework", cfg.framework.name, cfg.framework)
        self.loggers: list[Logger] = (
            # `logger=[]` composes to no `logger` key at all
            [registry.create("logger", name, node) for name, node in (cfg.get("logger") or {}).items()]
            if dist.is_main
            else []
        )
        t = cfg.trainer
        self.shard = Shard(dist.rank, dist.world_size)
        plan, self.resize = self._plan_resize(resume_from)
        #: images per rank in a micro-batch, and micro-batches per optimizer step: trainer.batch_size and
        #: trainer.accumulate_batches, or what trainer.on_resize made of them on another world size than
        #: planned (the config stays as given: it says what was planned)
        self.batch_size, self.accumulate = plan.batch_size, plan.accumulate
        train_length = self.data.info.train_length
        self.global_batch = check_one_global_batch(train_length, self.batch_size, self.accumulate, dist.world_size)
        self.steps_per_epoch = train_length // self.global_batch
        self.total_steps = self.steps_per_epoch * t.epochs
        if t.max_steps is not None:
            self.total_steps = min(self.total_steps, t.max_steps)
        o = cfg.optimizer
        self.schedule = LRSchedule(
            base_lr=o.lr,
            global_batch=self.global_batch,
            steps_per_epoch=self.steps_per_epoch,
            warmup_epochs=o.warmup_epochs,
            decay_epochs=tuple(o.decay_epochs),
            decay_factor=o.decay_factor,
            reference_batch=o.reference_batch,
            scale_lr=o.scale_lr,
        )
        self.meter = ThroughputMeter(self.global_batch, t.warmup_steps)
        #: trainer.profile's window of steps (ddlkit.rank.profiling); None when it is off
        self.profile = ProfileWindow.of(self)
        #: this rank's step phases; on rank 0 of several, the verdict on stragglers (dist.straggler_factor)
        d = cfg.dist
        self.telemetry = StepTelemetry(self.batch_size * self.accumulate, sync_clock=dist, enabled=d.telemetry)
        self._telemetry_due = 0.0
        self.stragglers = (
            StragglerWatch(d.straggler_factor, d.straggler_window)
            if dist.is_main and dist.world_size > 1 and d.straggler_factor and d.telemetry
            else None
        )
        self.state = RunState()
        self.resume_from = resume_from
        self.resumed_at: RunState | None = None
        self.last_loss: float | None = None
        self.epoch_metrics: dict[str, float] = {}
        self.best_top1: float | None = None
        #: fields plugins add to result.json (e.g. staging_time_s); the core's own keys win
        self.extra_result: dict[str, Any] = {}
        self._stop_request = StopRequest()
        #: the job's checkpoint files: written on rank 0, the one resumed from loaded on every rank
        self.checkpoints = CheckpointKeeper(
            self.job_dir,
            keep=t.keep_checkpoints,
            writer=dist.is_main,
            resume_from=resume_from,
            checksum=t.checkpoint_checksum,
        )
        self.checkpoints.on_written = self._checkpoint_written
        #: when the run was built (wall clock): result.json's wall_time_s counts from here
        self.started = time.time()
        self._active_loggers: list[Logger] = []
        #: intra-op threads each rank computes with, as the framework set them (framework.num_threads)
        self.num_threads: int | None = None
        #: where this rank computes ("cpu", "cuda:0", see ddlkit.result): the framework sets it
        self.device: str | None = None
        #: the framework's peak device memory in MiB, or a function returning it (None on the CPU):
        #: result.json's peak_memory_mib then says it instead of the process's peak RSS (ddlkit.rank.memory)
        self.device_peak_memory_mib: float | Callable[[], float | None] | None = None
        #: trainer.early_stopping and trainer.best_checkpoint, when they watch a metric
        self.early_stopping = EarlyStopping(t.early_stopping) if t.early_stopping.monitor else None
        self.best = Watch("best_checkpoint", t.best_checkpoint) if t.best_checkpoint.monitor else None
        #: trainer.callbacks, called through the hooks like a plugin until finish()
        self._callbacks = CallbackPlugin(load_callbacks(t.callbacks)) if t.callbacks else None
        if self._callbacks is not None:
            pm.register(self._callbacks)

    def _plan_resize(self, resume_from: Path | None) -> tuple[BatchPlan, dict[str, Any] | None]:
        """The rank's batch: as planned, or on another world size than the job was planned for (an
        elastic restart on fewer nodes, or back on all of them) what ``trainer.on_resize`` makes of
        it, said on rank 0; and the record of that for result.json (None: nothing changed)."""
        t, world = self.cfg.trainer, self.dist.world_size
        planned_world = int(os.environ.get(PLANNED_WORLD_SIZE_ENV) or world)
        saved = saved_position(resume_from) or {}
        resumed_global = saved.get("global_batch_size")
        planned = BatchPlan(planned_world, t.batch_size, t.accumulate_batches)
        plan = plan_batch(
            t,
            planned_world,
            world,
            resumed_global_batch=resumed_global,
            resumed_batch=int((saved.get("state") or {}).get("batch", 0)),
        )
        if planned_world == world and plan == planned:
            return planned, None
        line = describe(planned, plan, self.cfg.optimizer, t.on_resize)
        if self.dist.is_main:
            print(
                f"ddlkit: {world} rank{'s' if world != 1 else ''} instead of the planned {planned_world}: {line}",
                flush=True,
            )
        return plan, {
            "planned_world_size": planned_world,
            "world_size": world,
            "on_resize": str(t.on_resize),
            "planned_batch_size_per_rank": planned.batch_size,
            "planned_accumulate_batches": planned.accumulate,
            "planned_global_batch_size": planned.global_batch,
            "description": line,
        }

    # ---------------------------------------------------------------- framework side
    def phase(self, what: str, *, say: bool = True) -> None:
        """Say on rank 0 that start-up reached ``what`` ("model built", "data ready"), with the
        seconds since the rank started; the worker and the Run say the rest (ranks connected,
        first step done). Every phase is recorded in result.json's ``startup_s``; ``say=False``
        records without a line (a framework's import)."""
        if say:
            report_phase(self.dist, what)
        else:
            record_phase(what)

    def build_model(self, **kwargs: Any) -> Any:
        """The selected model (``model=<name>``), built by the selected framework's registration
        of it as ``factory(cfg.model, data=DataInfo, **kwargs)``."""
        return self.registry.create_for(
            "model", self.cfg.framework.name, self.cfg.model.name, self.cfg.model, data=self.data.info, **kwargs
        )

    def build_optimizer(self, *args: Any, **kwargs: Any) -> Any:
        """The selected optimizer (``optimizer=<name>``), built by the selected framework's
        registration of it as ``factory(cfg.optimizer, *args, **kwargs)``; the learning rate it
        is built with does not matter: the framework sets ``schedule(step)`` at every step."""
        return self.registry.create_for(
            "optimizer", self.cfg.framework.name, self.cfg.optimizer.name, self.cfg.optimizer, *args, **kwargs
        )

    def loaders(self) -> tuple[Loader, Loader | None]:
        """This rank's ``(train, val)`` loaders of the selected data source: batches of
        :attr:`batch_size` from the rank's shard, ordered by ``trainer.seed``; ``val`` is None
        when ``trainer.validate`` is off. With ``trainer.accumulate_batches=N`` each batch is one
        micro-batch: :meth:`step_batches` groups N of them per optimizer step (or the framework
        groups them in its own pipeline)."""
        t = self.cfg.trainer

        def loader(split: Split) -> Loader:
            return self.data.loader(split, batch_size=self.batch_size, shard=self.shard, seed=t.seed)

        return loader("train"), (loader("val") if t.validate else None)

    def checkpointing(
        self, save: SaveFn, load: LoadFn, snapshot: SnapshotFn | None = None, *, sharded: bool = False
    ) -> RunState:
        """Register how to write/read the framework's state, load ``resume_from`` if set, and
        return where training starts. ``save(path, meta)`` must write everything to ``path``
        (a file, or a directory it creates) and ``load(path)`` must return ``meta``. A framework
        that can copy its state cheaply also gives ``snapshot(meta)``, which returns a writer of
        that copy: checkpoints in the middle of training are then written in the background
        (``trainer.checkpoint_async``). ``sharded``: every rank writes its part of each checkpoint,
        a directory (see :class:`~ddlkit.rank.checkpointing.CheckpointKeeper`). From here on a
        SIGTERM checkpoints at the next step boundary. Call :meth:`start` next."""
        self.checkpoints.save = save
        self.checkpoints.sharded = sharded
        if self.cfg.trainer.checkpoint_async:
            self.checkpoints.snapshot = snapshot
        self._stop_request.training = True
        self.checkpoints.remove_stale()
        if self.resume_from is not None:
            meta = self.checkpoints.load(load, self.resume_from)
            check_compatible(meta, self.resume_from, framework=self.cfg.framework.name, model=self.cfg.model.name)
            self._resume(meta)
        return self.state

    def _resume(self, meta: Mapping[str, Any]) -> None:
        """Take up the state a checkpoint's ``meta`` holds (see :meth:`_checkpoint_meta`)."""
        self.state = RunState(**meta["state"])
        self.resumed_at = RunState(**meta["state"])
        saved_global = meta.get("global_batch_size")
        if saved_global and saved_global != self.global_batch:
            self._resume_position(saved_global)
        self.checkpoints.saved_at = (self.state.step, self.state.epoch)
        self.last_loss = meta.get("last_loss")
        self.best_top1 = meta.get("best_top1")
        # a watcher resumes where it was (if it watched the same metric then)
        for key, watcher in self._watchers().items():
            saved = (meta.get("watchers") or {}).get(key)
            if saved and saved.get("monitor") == watcher.monitor:
                watcher.load(saved)

    def _resume_position(self, saved_global: int) -> None:
        """Go on from a checkpoint whose steps were of another global batch (``trainer.on_resize=
        scale_lr`` on another world size): at the same image of its epoch -- a step boundary of this
        global batch, which :func:`ddlkit.resize.plan_batch` ensured --, with the learning-rate
        schedule and the run's last step where this global batch puts them. ``state.step`` goes on
        counting the optimizer steps taken, whatever their size."""
        st = self.state
        images = st.batch * saved_global
        st.batch = images // self.global_batch
        # the schedule follows the epochs: its step is where this global batch has reached
        offset = st.step - (st.epoch * self.steps_per_epoch + st.batch)
        self.schedule = replace(self.schedule, step_offset=offset)
        self.total_steps = self.steps_per_epoch * self.cfg.trainer.epochs + offset
        if self.cfg.trainer.max_steps is not None:
            self.total_steps = min(self.total_steps, self.cfg.trainer.max_steps)
        if self.dist.is_main:
            print(
                f"ddlkit: resuming {images} images into epoch {st.epoch}: at its step {st.batch} of "
                f"{self.steps_per_epoch} (global batch {saved_global} -> {self.global_batch})",
                flush=True,
            )

    def start(self) -> None:
        """Training starts now: fire ``ddlkit_run_start`` and start the loggers. Call it once,
        after :meth:`checkpointing` (the hooks and loggers see the resumed state) and before
        the first step."""
        self.hook.ddlkit_run_start(run=self)
        if self.profile is not None:
            self.profile.step(self.state.step)
        for lg in self.loggers:
            lg.start(self)
            self._active_loggers.append(lg)

    def restore(self, save: SaveFn, load: LoadFn) -> RunState:
        """Deprecated: :meth:`checkpointing`, then :meth:`start`. It was the documented framework
        contract of 0.1, so framework plugins outside this repository call it; it goes in 0.2."""
        warnings.warn(
            "Run.restore(save, load) is deprecated and goes in ddlkit 0.2: call run.checkpointing(save, "
            "load), then run.start()",
            DeprecationWarning,
            stacklevel=2,
        )
        state = self.checkpointing(save, load)
        self.start()
        return state

    def step_batches(self, micro_batches: Callable[[int, int], Iterable[Any]]) -> Callable[[int, int], Iterable[list]]:
        """A loader's ``iter_epoch(epoch, start_batch)`` as :meth:`train_epochs` wants ``batches``:
        one list of ``trainer.accumulate_batches`` micro-batches per optimizer step (see
        :func:`.loop.step_batches`)."""
        return loop.step_batches(micro_batches, self.accumulate)

    def train_epochs(
        self,
        batches: Callable[[int, int], Iterable[Any]],
        step: Callable[[Any, float], Callable[[], float] | float],
        evaluate: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """The epoch loop every framework shares, from where :meth:`checkpointing` left off to the
        end: ``batches(epoch, start)``, ``step(batch, lr)`` and ``evaluate()`` are what the
        framework brings (see :func:`.loop.train_epochs`)."""
        loop.train_epochs(self, batches, step, evaluate)

    @property
    def finished(self) -> bool:
        return self.state.step >= self.total_steps or self.stopped_early

    @property
    def stopped_early(self) -> bool:
        return self.early_stopping is not None and self.early_stopping.reason is not None

    def logs_at(self, step: int) -> bool:
        """Whether :meth:`step_end` logs, and so reads the loss, at 1-based ``step``: every
        ``trainer.log_every`` steps and at the last one. A loop that must fetch the loss from
        the device, or a callback that receives it only some steps, asks this."""
        return step % self.cfg.trainer.log_every == 0 or step == self.total_steps

    def step_end(self, loss: Callable[[], float] | float, lr: float) -> bool:
        """Record one optimizer step. Returns True when the loop must stop now (max_steps
        reached or a stop requested; a checkpoint has then been written)."""
        self.meter.tick()
        self.telemetry.tick()
        if self.meter.steps_seen == 1:
            self.phase("first step done")
        self.checkpoints.poll()  # a checkpoint written in the background is complete: announce it
        st = self.state
        st.step += 1
        st.batch += 1
        t = self.cfg.trainer
        if self.logs_at(st.step):
            self._log_step(loss, lr)
        stopping = self._stop_request.agreed(self.dist, st.step, self.cfg.dist.stop_check_every)
        stop = stopping or st.step >= self.total_steps
        # at an epoch's last batch the framework calls epoch_end next, which checkpoints the
        # finished epoch; saving here too would write the same step twice
        at_epoch_end = st.batch >= self.steps_per_epoch and not stopping
        if not at_epoch_end and (stop or (t.checkpoint_every and st.step % t.checkpoint_every == 0)):
            # the run's last checkpoint is complete before the run ends; the others may be written
            # while training goes on
            self.save_checkpoint(background=not stop)
        if self.profile is not None:
            self.profile.step(st.step)
        if stopping:
            raise Preempted(f"stopped on request at step {st.step}")
        return stop

    def _log_step(self, loss: Callable[[], float] | float, lr: float) -> None:
        """Read the loss of the step just taken and log it, with the learning rate, the epoch and
        the recent rate, to the loggers and the ``ddlkit_step_end`` hooks."""
        st = self.state
        self.last_loss = loss() if callable(loss) else float(loss)
        mine = {"t": self.telemetry.summary(), "node": self.dist.node, "host": HOST} if self.telemetry.enabled else None
        # rank 0 logs the loss of the global batch (every rank then judges the same value), and gathers
        # the ranks' step telemetry in the same round trip
        means, ranks = self.dist.mean_and_gather({"loss": self.last_loss}, mine)
        self.last_loss = means["loss"]
        if not math.isfinite(self.last_loss):
            raise RunError(
                f"loss became {self.last_loss} at step {st.step}: training diverged. Lower optimizer.lr "
                "or raise optimizer.warmup_epochs.",
                component="framework",
                step=st.step,
            )
        rate = self.meter.recent_rate()
        metrics = {
            "loss": self.last_loss,
            "lr": lr,
            "epoch": st.epoch + st.batch / self.steps_per_epoch,
            # none yet at the first step of an attempt: a rate needs two
            **({"images_per_sec": rate} if rate is not None else {}),
        }
        if ranks is not None and len(ranks) > 1 and self.telemetry.enabled:
            metrics.update(self._rank_telemetry(st.step, ranks))
        for lg in self.loggers:
            lg.log_metrics(st.step, metrics, split="train")
        self.hook.ddlkit_step_end(run=self, step=st.step, metrics=metrics)

    def _rank_telemetry(self, step: int, ranks: list[dict[str, Any]]) -> dict[str, float]:
        """Rank 0: the ranks' step telemetry of the window that ended at ``step`` -- the straggler
        verdict said, ``telemetry.json`` (``ddlkit jobs status`` reads it) written, and the
        per-rank fields of the metrics returned."""
        summaries = [r["t"] for r in ranks]
        if self.stragglers is not None:
            self.stragglers.nodes = [r["node"] for r in ranks]
            for line in self.stragglers.observe(step, summaries):
                print(line, file=sys.stderr, flush=True)
        table = rank_table(ranks)
        current = self.stragglers.current if self.stragglers is not None else {}
        if time.monotonic() >= self._telemetry_due or step >= self.total_steps:
            # a view for `ddlkit jobs status`, not data: replaced whole, not synced to disk, at most every few s
            self._telemetry_due = time.monotonic() + TELEMETRY_EVERY_S
            view = {"step": step, "time": round(time.time(), 3), "ranks": table, "stragglers": sorted(current)}
            replace_text(self.job_dir / TELEMETRY_FILE, json.dumps(view))
        keys = ("images_per_sec", "data_wait", "sync_wait")
        return {f"rank{row['rank']}/{key}": row[key] for row in table for key in keys}

    def validation_end(self, **metrics: float) -> None:
        """Report validation metrics (``val_loss``, ``val_top1``, ``val_top5``) for the current state."""
        self.meter.pause()
        self.telemetry.pause()
        # each rank validated its own shard: rank 0 logs (and checkpoints) the mean over ranks
        self.epoch_metrics = self.dist.allreduce_mean({k: float(v) for k, v in metrics.items()})
        if "val_top1" in self.epoch_metrics:
            self.best_top1 = max(self.best_top1 or 0.0, self.epoch_metrics["val_top1"])
        epoch = self.state.epoch + min(self.state.batch / self.steps_per_epoch, 1.0)
        for lg in self.loggers:
            lg.log_metrics(self.state.step, {"epoch": epoch, **self.epoch_metrics}, split="val")
        if self.checkpoints.holds(self.state):
            # the validation of a run stopped mid-epoch (max_steps), checkpointed already
            self._keep_best()

    def epoch_end(self, **metrics: float) -> bool:
        """Call after each full epoch, with its validation metrics if validation ran. Returns True
        when the run stops early (``trainer.early_stopping``); its checkpoint is written then."""
        if metrics:
            self.validation_end(**metrics)
        st = self.state
        st.epoch += 1
        st.batch = 0
        self.meter.pause()
        self.telemetry.pause()
        self.hook.ddlkit_epoch_end(run=self, epoch=st.epoch, metrics=self.epoch_metrics)
        stop = False
        if self.early_stopping is not None and metrics:
            # every rank judges the same, bit-identical means (DistContext.allreduce_mean), so all
            # stop at the same epoch without another exchange
            stop = self.early_stopping.should_stop(self.epoch_metrics, step=st.step, epoch=st.epoch)
            if stop and st.step < self.total_steps and self.dist.is_main:
                print(
                    f"ddlkit: stopping early after epoch {st.epoch} (step {st.step}): {self.early_stopping.reason}",
                    flush=True,
                )
        ends = stop or st.step >= self.total_steps
        self.save_checkpoint(background=not ends)
        if metrics:
            self._keep_best()
        return stop and st.step < self.total_steps

    def _keep_best(self) -> None:
        """After a validation whose state is checkpointed: if it is the best so far of
        ``trainer.best_checkpoint.monitor``, keep that checkpoint as ``checkpoints/best.ckpt``."""
        if self.best is None or not self.best.update(self.epoch_metrics, step=self.state.step, epoch=self.state.epoch):
            return
        self.checkpoints.keep_best()

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, *, background: bool = False) -> None:
        """Write a checkpoint of the current state (rank 0, or every rank its part of a sharded
        one; no-op if already saved at this point). With ``background``, only the copy of the
        state is taken now (where the framework gave a ``snapshot``): ``ddlkit_checkpoint_saved``
        then fires at a later step, once it is complete."""
        if not self.checkpoints.is_due(self.state):
            return
        self.meter.pause()
        self.telemetry.pause()
        self.checkpoints.write(self.state, self._checkpoint_meta(), background=background)

    def _checkpoint_written(self, path: Path, step: int) -> None:
        self.hook.ddlkit_checkpoint_saved(run=self, path=str(path), step=step)

    def _checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run beside the framework's state (see :meth:`_resume`)."""
        return {
            "state": asdict(self.state),
            "last_loss": self.last_loss,
            "best_top1": self.best_top1,
            "framework": self.cfg.framework.name,
            "model": self.cfg.model.name,
            "global_batch_size": self.global_batch,
            "watchers": {key: {"monitor": w.monitor, **w.state()} for key, w in self._watchers().items()},
        }

    def _watchers(self) -> dict[str, Watch]:
        """The watchers in use, under the keys a checkpoint keeps their state by."""
        return {
            key: w
            for key, w in (("early_stopping", self.early_stopping), ("best_checkpoint", self.best))
            if w is not None
        }

    def save_artifact(self, name: str, write: Callable[[Path], None]) -> Path | None:
        """Write a file such as the final model into the job directory atomically (rank 0 only)."""
        return self.checkpoints.write_artifact(name, write)

    # ---------------------------------------------------------------- lifecycle
    @property
    def stop_requested(self) -> bool:
        """This rank was asked to stop (SIGTERM); the ranks act on it together (:meth:`StopRequest.agreed`)."""
        return self._stop_request.requested

    @stop_requested.setter
    def stop_requested(self, requested: bool) -> None:
        self._stop_request.requested = requested

    def install_signal_handlers(self) -> None:
        """SIGTERM (preemption, cancel) -> checkpoint at the next step boundary, then exit."""
        self._stop_request.install()

    def result(self, status: str) -> dict[str, Any]:
        """The content of result.json: one key per row of :data:`ddlkit.result.FIELDS`, in its order,
        after the keys plugins add through ``extra_result``. With several ranks every rank calls it
        (:meth:`finish` does, once the run completed): the peak memory is gathered from them all."""
        t = self.cfg.trainer
        early, best = self.early_stopping, self.best
        peak_mib, peak_kind = peak_over_ranks(self.dist, self.device_peak_memory_mib)
        return {
            **self.extra_result,
            "status": status,
            "framework": self.cfg.framework.name,
            "model": self.cfg.model.name,
            "data": self.cfg.data.name,
            "world_size": self.dist.world_size,
            "batch_size_per_rank": self.batch_size,
            "global_batch_size": self.global_batch,
            "precision": str(t.precision),
            "device": self.device,
            # the largest of the ranks' peaks: device memory where every rank's framework reported it, else RSS
            "peak_memory_mib": peak_mib,
            "peak_memory": peak_kind,
            "epochs": self.state.epoch,
            "steps": self.state.step,
            "steps_per_epoch": self.steps_per_epoch,
            "images_per_sec": round(self.meter.images_per_sec, 3),
            "measured_steps": self.meter.measured_steps,
            "warmup_steps": t.warmup_steps,
            "final_loss": self.last_loss,
            "val_loss": self.epoch_metrics.get("val_loss"),
            "top1": self.epoch_metrics.get("val_top1"),
            "top5": self.epoch_metrics.get("val_top5"),
            "best_top1": self.best_top1,
            "peak_lr": self.schedule.peak_lr,
            "wall_time_s": round(time.time() - self.started, 3),
            "resumed_from_step": self.resumed_at.step if self.resumed_at else None,
            "restarts": int(os.environ.get(RESTARTS_ENV) or 0),
            "steps_lost": int(os.environ.get(STEPS_LOST_ENV) or 0),
            "accumulate_batches": self.accumulate,
            # the job ran on another world size than planned (an elastic restart): what that changed
            "resize": self.resize,
            "clip_grad_norm": t.clip_grad_norm or None,
            # why the run ended before its last epoch, or None
            "stopped_early": (
                {"monitor": early.monitor, "reason": early.reason, "epoch": self.state.epoch, "step": self.state.step}
                if self.stopped_early and early is not None
                else None
            ),
            # rank 0's start-up: when its process started, and when it reached each phase
            "startup_s": startup(),
            "best_checkpoint": (
                {
                    "monitor": best.monitor,
                    "mode": best.mode,
                    "value": best.best,
                    "step": best.best_step,
                    "epoch": best.best_epoch,
                    "path": f"{CHECKPOINT_DIR}/{BEST}",
                }
                if best is not None and best.best is not None
                else None
            ),
            "stragglers": self.stragglers.record() if self.stragglers is not None else [],
            "checkpoint_stall_s": self.checkpoints.stall_summary(),
        }

    def finish(self, status: str) -> dict[str, Any] | None:
        if self.profile is not None:
            self.profile.close()  # a run that ends inside the window still writes its trace
        try:
            self.checkpoints.wait()  # a run that failed or was interrupted mid-write
        except DdlkitError as err:
            if status == "completed":
                raise
            print(f"ddlkit: warning: {err}", file=sys.stderr, flush=True)
        result = self.result(status) if status == "completed" else None
        if result is not None and self.dist.is_main:
            keep_results(result, self.job_dir, self.storage, self.name)
        try:
            self.hook.ddlkit_run_end(run=self, status=status, result=result)
        finally:
            if self._callbacks is not None:
                self.pm.unregister(self._callbacks)
            for lg in self._active_loggers:
                lg.finish(status, result)
        return result


def _data_root_as_read_here(cfg: DictConfig, storage: StorageBackend) -> None:
    """A relative ``data.root`` as this rank must read it, before the data source lists it: where
    the launcher shares its disk with the ranks it made the path absolute already; elsewhere (Ray,
    Azure) it is below the storage's mount (``storage=nfs``) or the job's code snapshot, the copy
    of the directory ``ddlkit`` was started in (issue 37, item 14)."""
    root = cfg.data.get("root")
    if isinstance(root, str):
        cfg.data.root = storage.launch_relative(root, launch_dir())
