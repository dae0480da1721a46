"""Frameworks: build the model and drive the training loop of one rank."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pathlib import Path

    from omegaconf import DictConfig

    from .run import RunContext


class Profiler(ABC):
    """A framework's profiler over a window of optimizer steps (``trainer.profile``), which the run
    drives: :meth:`start` before the window's first step, :meth:`step` between two of its steps,
    :meth:`stop` after its last one -- or when the run ends inside the window (a stop on request, a
    failure), so that the steps recorded are still written. Made by :meth:`Framework.profiler`
    just before the window, on every rank; no profiler object exists outside the window.

    A PyTorch one wraps ``torch.profiler.profile`` (``step`` is its ``step()``); a TensorFlow
    one calls ``tf.profiler.experimental.start(out_dir)`` and ``stop()`` and needs no ``step``.
    """

    @abstractmethod
    def start(self, steps: range) -> None:
        """Start recording the window's optimizer ``steps`` (1-based, as ``run.state.step`` counts
        them once each is done): ``range(20, 25)`` for ``trainer.profile.start_step=20
        trainer.profile.num_steps=5``; the first of them begins now."""

    def step(self, step: int) -> None:
        """Optimizer step ``step`` is done and step ``step + 1``, also in the window, begins
        (the place for a step marker in the trace). Nothing by default."""

    @abstractmethod
    def stop(self) -> None:
        """Stop recording and write this rank's trace into the directory the profiler was made
        for (one file or folder per rank: the ranks of a node share the directory)."""


class Framework(ABC):
    """Trains ``run.cfg.model`` on ``run.data`` and reports through ``run``.

    Everything shared lives in the run it is handed (:class:`ddlkit.RunContext`): the LR
    schedule, the throughput meter, logging, checkpoints (atomic, rank 0) and resume state. A
    framework:

    * takes its data from ``run.loaders()``: this rank's train and validation loaders, built
      from ``run.batch_size`` (``trainer.batch_size``, or as an elastic restart resized it), the
      rank's shard and ``trainer.seed``;
    * calls ``run.checkpointing(save, load)`` once its model and optimizer exist, with functions
      that write its state to a path and read it back (the run loads ``resume_from`` then), and
      ``run.start()`` right before its first step (the ``ddlkit_run_start`` hook, the loggers);
    * hands the loop to ``run.train_epochs(batches, step, evaluate)``: its per-step work and
      validation, while the run schedules the learning rate, counts steps, logs, checkpoints and
      stops. A framework whose loop is not its own (Keras' ``fit``) makes the same calls from
      its callbacks: ``run.schedule(step)``, ``run.step_end(loss=..., lr=...)`` after every
      optimizer step, ``run.epoch_end(val_loss=..., val_top1=..., val_top5=...)`` after each
      epoch's validation;
    * saves the trained model with ``run.save_artifact(name, write)``.

    What it trains comes from the registry, not from the framework: ``run.build_model()`` builds
    the selected model with this framework's registration of it (``ddlkit_models``) and
    ``run.build_optimizer(...)`` the selected optimizer (``ddlkit_optimizers``); the launcher has
    checked that both exist for this framework. The data arrive as framework-neutral batches
    (``run.loaders()``); turning them into tensors and an input pipeline is the framework
    plugin's own business.
    """

    #: the libraries whose model objects this framework trains, by top-level module, with what a
    #: user calls such an object (``{"torch": "a PyTorch module"}``): a custom model of one of them
    #: given to another framework is refused with "use framework=<this one>"
    model_libraries: ClassVar[Mapping[str, str]] = {}
    #: whether ddlkit's release images (``docker/Dockerfile``, built by ``scripts/build_images.sh``)
    #: exist for this framework: remote targets then default ``compute.image`` to one of them
    release_image: ClassVar[bool] = False
    #: the ``dist.backend`` values this framework trains with; another is refused in the launcher
    #: with one line naming these
    backends: ClassVar[tuple[str, ...]] = ("none", "native", "horovod")

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def configure(self, config: DictConfig) -> None:
        """Validate this framework's options against the whole composed ``config`` in the launcher,
        before anything runs; raise ConfigError. Called for the selected framework only."""

    def check_environment(self, config: DictConfig) -> None:
        """Raise ConfigError when this Python environment cannot train ``config``: a package the
        job needs is missing (Horovod for ``dist=horovod``, Pillow for JPEGs, a CUDA build). Called
        on every rank before training, and in the launcher before submitting when the target's ranks
        run with the launcher's environment (``ComputeTarget.ranks_share_environment``): a laptop
        that plans a cluster job needs none of what the cluster's image provides."""

    @abstractmethod
    def train(self, run: RunContext) -> None:
        """Train from ``run.resume_from`` (if set) to the end of ``trainer.epochs``."""

    def profiler(self, run: RunContext, out_dir: Path) -> Profiler | None:
        """A :class:`Profiler` that writes this rank's trace of ``trainer.profile``'s window into
        ``out_dir`` (the job directory's ``profile/``, which the framework may lay out as its
        viewer reads it; ``run.dist.rank`` names the rank's file), or None: this framework has no
        profiler, and the run says so and trains on unprofiled. Called on every rank right
        before the window's first step, only when ``trainer.profile.start_step`` is set."""
        return None
