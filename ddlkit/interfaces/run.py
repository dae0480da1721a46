"""What a plugin may use of a run: :class:`RunContext`, the ``run`` every interface method and
lifecycle hook is handed.

The rank's :class:`ddlkit.Run` implements it; the interfaces, the hook specifications and the
callbacks are typed against these protocols, not against that class, so the shared base does
not depend on the rank that runs it, and a plugin sees what it may rely on and nothing of how
the run does it (its meter, checkpoint bookkeeping, signal handling and result.json stay its
own). ``tests/test_run_context.py`` fails when ``Run`` lacks a member declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..optim import LRScaling
    from .data import DataSource, Loader
    from .framework import Framework
    from .logger import Logger
    from .storage import StorageBackend

#: ``save(path, meta)``: write the framework's whole state to ``path`` (a file, or a directory it creates)
SaveFn = Callable[[Path, dict[str, Any]], None]
#: ``load(path)``: read a state written by the matching ``save`` back, returning its ``meta``
LoadFn = Callable[[Path], dict[str, Any]]
#: ``snapshot(meta)``: copy the framework's whole state now (into host memory, as it is at this step
#: boundary) and return a function that writes that copy to a path exactly as ``save`` would; ddlkit
#: calls the returned function on another thread while training goes on (``trainer.checkpoint_async``)
SnapshotFn = Callable[[dict[str, Any]], Callable[[Path], None]]


@dataclass
class RunState:
    """Progress counters; saved in every checkpoint's metadata."""

    #: 0-based epoch in progress
    epoch: int = 0
    #: optimizer steps taken since the start of training (across resumes)
    step: int = 0
    #: optimizer steps of the current epoch already taken (each of ``trainer.accumulate_batches``
    #: micro-batches): the same images whatever the ranks and micro-batches that make up the global batch
    batch: int = 0


class DistView(Protocol):
    """This rank's place among the job's ranks and the collectives plugins may call
    (:class:`ddlkit.DistContext` implements it); ``run.dist``. Read-only: the ranks' layout is
    fixed for the life of the job."""

    @property
    def rank(self) -> int:
        """0-based rank of this process in the job."""

    @property
    def world_size(self) -> int:
        """Number of ranks in the job."""

    @property
    def local_rank(self) -> int:
        """0-based rank among the ranks of this node."""

    @property
    def local_size(self) -> int:
        """Number of ranks on this node."""

    @property
    def node(self) -> int:
        """0-based index of the (possibly simulated) node this rank runs on."""

    @property
    def backend(self) -> str:
        """``dist.backend``: "none", "native" or "horovod"."""

    @property
    def node_scratch(self) -> str | None:
        """This node's local scratch directory ("local SSD") when the launcher provides one."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that logs, checkpoints and writes result.json."""

    @property
    def is_local_main(self) -> bool:
        """Local rank 0: does per-node duties such as staging data to the node's disk."""

    def allreduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Element-wise ``sum``/``mean``/``max``/``min`` of ``values`` over all ranks, bit-identical on each."""

    def allreduce_mean(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The mean over all ranks of each metric (every rank passes the same keys)."""

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any rank."""

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """``obj`` as passed on rank ``root``, on every rank (JSON-serialisable values)."""

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (JSON-serialisable values)."""

    def barrier(self) -> None:
        """Wait until every rank has reached this call."""


class Schedule(Protocol):
    """The learning-rate rule shared by every framework (:class:`ddlkit.LRSchedule` implements
    it); ``run.schedule``."""

    @property
    def base_lr(self) -> float:
        """``optimizer.lr``, stated for ``reference_batch``."""

    @property
    def global_batch(self) -> int:
        """Images per optimizer step over all ranks."""

    @property
    def reference_batch(self) -> int:
        """The global batch ``base_lr`` is stated for."""

    @property
    def scaling(self) -> LRScaling:
        """How ``base_lr`` is scaled from ``reference_batch`` to ``global_batch``."""

    @property
    def peak_lr(self) -> float:
        """The rate at the end of warm-up."""

    def __call__(self, step: int) -> float:
        """The learning rate of 0-based optimizer step ``step``."""


class StepClock(Protocol):
    """What a framework may tell of its step's phases (``run.telemetry``): the waits for the other
    ranks it can see the end of, so that a straggler is told from the ranks that wait for it."""

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time the ``"data"`` (waiting for the next batch) or ``"step"`` phase of a step: the
        shared epoch loop does; a framework with a loop of its own may."""
        ...

    def waiting(self, what: str = ...) -> AbstractContextManager[None]:
        """Time a wait for the other ranks (a hang report says ``what`` of a rank that waits here)."""
        ...

    def add_sync(self, seconds: float) -> None:
        """Count ``seconds`` of waiting for the other ranks, timed by the framework itself."""
        ...


class RunContext(Protocol):
    """The rank-side state of a job as plugins see it: handed to the framework (``train``), the
    data source (``prepare``), the storage backend (``prepare_data``), the loggers (``start``)
    and every lifecycle hook. A framework's loop talks only to this object (see
    :class:`ddlkit.Framework`); the rules shared by all frameworks live behind it once.

    :class:`ddlkit.Run` implements it (and, until 0.2, the deprecated ``restore``, which is left
    off here).
    """

    # ---------------------------------------------------------------- everyone: what runs where
    cfg: DictConfig  #: the whole composed config, typed (``cfg.trainer``, ``cfg.model``, your group's node)
    name: str  #: the job's name (unique per job; results are published under it)
    job_dir: Path  #: the job directory, shared by every rank: checkpoints, artifacts, result.json, logs
    data: DataSource  #: the selected data source (``run.data.info``: sizes, classes, image size)
    storage: StorageBackend  #: the selected storage backend
    framework: Framework  #: the selected framework
    loggers: list[Logger]  #: the selected loggers on rank 0; empty on the other ranks

    # read-only (properties), so that any implementation of the protocol satisfies them
    @property
    def dist(self) -> DistView:
        """This rank's place among the ranks, and the collectives."""

    # ---------------------------------------------------------------- everyone: sizes and progress
    global_batch: int  #: images per optimizer step over all ranks (batch_size x world_size x accumulate)
    steps_per_epoch: int  #: optimizer steps in one epoch
    total_steps: int  #: optimizer steps the run trains for (``trainer.epochs``, capped by ``trainer.max_steps``)
    #: images per rank in a micro-batch: ``trainer.batch_size``, unless an elastic restart runs the job on another
    #: world size, where ``trainer.on_resize`` may change it (the config keeps what was planned)
    batch_size: int
    accumulate: int  #: micro-batches per optimizer step (``trainer.accumulate_batches``, or as resized)
    state: RunState  #: where training is now: epoch, step, batch of the epoch
    resume_from: Path | None  #: the checkpoint this run resumes from, if any
    resumed_at: RunState | None  #: the state it resumed at, once :meth:`checkpointing` has loaded it

    @property
    def schedule(self) -> Schedule:
        """The learning rate of each step: ``run.schedule(step)``."""

    @property
    def finished(self) -> bool:
        """Whether the run reached ``total_steps`` or stopped early: no further step is due."""

    # ---------------------------------------------------------------- plugins report
    #: fields plugins add to result.json (e.g. staging_time_s); the core's own keys win
    extra_result: dict[str, Any]
    #: intra-op threads each rank computes with: the framework sets it, result and loggers read it
    num_threads: int | None
    #: where this rank computes, "cpu" or "cuda:<index>" (``ddlkit.result``): the framework sets it, result.json has it
    device: str | None
    #: this rank's peak device memory in MiB, for a framework that computes on a GPU: a number, or a
    #: function ddlkit calls once at the end of a completed run (PyTorch: ``lambda:
    #: torch.cuda.max_memory_allocated(device) / 2**20``); result.json's ``peak_memory_mib`` is the
    #: largest over the ranks, and the process's peak resident set size while this stays None (the CPU)
    device_peak_memory_mib: float | Callable[[], float | None] | None

    @property
    def telemetry(self) -> StepClock:
        """This rank's clock of its step phases (:class:`ddlkit.rank.telemetry.StepTelemetry`): a
        framework that can see where its step waits for the other ranks (the end of its gradient
        all-reduce) times that in ``with run.telemetry.waiting():`` or reports it with
        ``run.telemetry.add_sync(seconds)``, so that a straggler is told from the ranks that wait for it."""
        ...

    def phase(self, what: str, *, say: bool = True) -> None:
        """Say on rank 0 that start-up reached ``what`` ("model built", "data ready"); every phase
        is recorded in result.json's ``startup_s``, and ``say=False`` only records it."""

    # ---------------------------------------------------------------- frameworks: set up
    def build_model(self, **kwargs: Any) -> Any:
        """The selected model, built by this framework's registration of it (``ddlkit_models``)."""

    def build_optimizer(self, *args: Any, **kwargs: Any) -> Any:
        """The selected optimizer, built by this framework's registration of it (``ddlkit_optimizers``)."""

    def loaders(self) -> tuple[Loader, Loader | None]:
        """This rank's ``(train, val)`` loaders; ``val`` is None when ``trainer.validate`` is off."""

    def checkpointing(
        self, save: SaveFn, load: LoadFn, snapshot: SnapshotFn | None = None, *, sharded: bool = False
    ) -> RunState:
        """Register how the framework's state is saved and loaded (and, optionally, copied for a
        write in the background), resume, and return where training starts. ``sharded``: every
        rank's ``save`` writes its part of the state into the same directory and returns once
        every rank's part is written (a collective, as ``torch.distributed.checkpoint.save`` is);
        rank 0 then completes the checkpoint."""

    def start(self) -> None:
        """Training starts now: the ``ddlkit_run_start`` hooks and the loggers (after :meth:`checkpointing`)."""

    # ---------------------------------------------------------------- frameworks: the loop
    def step_batches(self, micro_batches: Callable[[int, int], Iterable[Any]]) -> Callable[[int, int], Iterable[list]]:
        """A loader's ``iter_epoch`` grouped into ``accumulate`` micro-batches per optimizer step."""

    def train_epochs(
        self,
        batches: Callable[[int, int], Iterable[Any]],
        step: Callable[[Any, float], Callable[[], float] | float],
        evaluate: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """The epoch loop every framework shares, from where :meth:`checkpointing` left off to the end."""

    def logs_at(self, step: int) -> bool:
        """Whether :meth:`step_end` reads the loss at 1-based ``step`` (a loop that must sync for it asks)."""

    def step_end(self, loss: Callable[[], float] | float, lr: float) -> bool:
        """Record one optimizer step (a loop not driven by :meth:`train_epochs`); True when it must stop."""

    def validation_end(self, **metrics: float) -> None:
        """Report validation metrics (``val_loss``, ``val_top1``, ``val_top5``) of the current state."""

    def epoch_end(self, **metrics: float) -> bool:
        """End a full epoch, with its validation metrics if any; True when the run stops early."""

    def save_artifact(self, name: str, write: Callable[[Path], None]) -> Path | None:
        """Write a file such as the final model into the job directory atomically (rank 0 only)."""
