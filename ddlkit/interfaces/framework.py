"""Frameworks: build the model and drive the training loop of one rank."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .run import RunContext


class Framework(ABC):
    """Trains ``run.cfg.model`` on ``run.data`` and reports through ``run``.

    Everything shared lives in the run it is handed (:class:`ddlkit.RunContext`): the LR
    schedule, the throughput meter, logging, checkpoints (atomic, rank 0) and resume state. A
    framework:

    * takes its data from ``run.loaders()``: this rank's train and validation loaders, built
      from ``trainer.batch_size``, the rank's shard and ``trainer.seed``;
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
