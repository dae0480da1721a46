"""Hook specifications for ddlkit plugins.

Two kinds of hook:

* **Registration hooks** (``ddlkit_data_sources`` ... ``ddlkit_loggers``, and the per-framework ``ddlkit_models``
  and ``ddlkit_optimizers``) are called once, after all plugins are loaded. They yield :class:`ddlkit.Registration`
  records; only the core maps a config name to an implementation, so only the core reports conflicts and choices.
* **Lifecycle hooks** are broadcast to every plugin during a run, with keyword arguments.
  Implementations may accept any subset of the arguments, so hooks grow by adding arguments.

Lifecycle hooks run in the worker process of *every* rank; use ``run.dist.is_main`` to do
rank-0-only work. What a hook may use of ``run`` is :class:`ddlkit.RunContext`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import pluggy

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .interfaces import ComputeTarget, DataSource, Framework, Logger, Registration, RunContext, StorageBackend

hookspec = pluggy.HookspecMarker("ddlkit")
hookimpl = pluggy.HookimplMarker("ddlkit")  #: decorator plugins use to mark hook implementations

RunStatus = Literal["completed", "failed", "interrupted"]


# -------------------------------------------------------------------------
# Registration hooks: called once, after all plugins are loaded
# -------------------------------------------------------------------------
@hookspec
def ddlkit_data_sources() -> Iterable[Registration[DataSource]]:
    """Register data sources; users select one with ``data=<name>``. Example::

        @ddlkit.hookimpl
        def ddlkit_data_sources():
            yield ddlkit.Registration("parquet", ParquetSource, config=ParquetConfig)

    :returns: Registrations. A name registered by two plugins raises :class:`PluginConflictError`.
    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_storage_backends() -> Iterable[Registration[StorageBackend]]:
    """Register storage backends; users select one with ``storage=<name>``. Example::

        @ddlkit.hookimpl
        def ddlkit_storage_backends():
            yield ddlkit.Registration("gcs", GcsStorage, config=GcsStorageConfig)

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_compute_targets() -> Iterable[Registration[ComputeTarget]]:
    """Register compute targets; users select one with ``compute=<name>``. Example::

        @ddlkit.hookimpl
        def ddlkit_compute_targets():
            yield ddlkit.Registration("slurm", SlurmTarget, config=SlurmConfig)

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_frameworks() -> Iterable[Registration[Framework]]:
    """Register deep-learning frameworks; users select one with ``framework=<name>``. Example::

        @ddlkit.hookimpl
        def ddlkit_frameworks():
            yield ddlkit.Registration("jax", JaxFramework, config=JaxConfig)

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_loggers() -> Iterable[Registration[Logger]]:
    """Register loggers; users select several at once with ``logger=[console,jsonl]``. Example::

        @ddlkit.hookimpl
        def ddlkit_loggers():
            yield ddlkit.Registration("mlflow", MlflowLogger, config=MlflowConfig)

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_models() -> Iterable[Registration[Any]]:
    """Register models, each for one framework; users select one with ``model=<name>``. Example::

        @dataclass
        class UNetConfig:
            # encoder stages
            depth: int = 4

        def build_unet(cfg, data):
            return UNet(depth=cfg.depth, classes=data.num_classes)   # a torch.nn.Module

        @ddlkit.hookimpl
        def ddlkit_models():
            yield ddlkit.Registration("unet", build_unet, config=UNetConfig, framework="pytorch")

    The factory is called as ``factory(cfg, data=DataInfo)`` on every rank and returns the
    framework's model (a ``torch.nn.Module`` for ``pytorch``, a ``keras.Model`` for ``tensorflow``
    and ``keras``); import the framework inside it. Several frameworks may register one name
    (the ResNets are registered by each framework plugin); options they share must agree.

    .. versionadded:: 0.2
    """


@hookspec
def ddlkit_optimizers() -> Iterable[Registration[Any]]:
    """Register optimizers, each for one framework; users select one with ``optimizer=<name>``.
    Example::

        @ddlkit.hookimpl
        def ddlkit_optimizers():
            yield ddlkit.Registration("sgd", build_sgd, config=ddlkit.optim.SGDConfig, framework="pytorch")

    What the factory is called with besides its config node is the framework's convention
    (PyTorch: ``factory(cfg, params)``; TensorFlow and Keras: ``factory(cfg)``). Its config
    subclasses :class:`ddlkit.optim.OptimizerConfig`, whose learning-rate schedule (Goyal et al.)
    the Run applies for every optimizer; the standard names share their schemas
    (:mod:`ddlkit.optim`), so ``optimizer=adamw`` means the same hyperparameters everywhere.

    .. versionadded:: 0.2
    """


# -------------------------------------------------------------------------
# Lifecycle hooks: broadcast; keyword arguments only
# -------------------------------------------------------------------------
@hookspec
def ddlkit_configure(config: DictConfig) -> None:
    """Check the composed config across components, in the launcher, before any work starts.

    A component's own options are checked by the component: constraints on a field of its
    schema (:mod:`ddlkit.options`), and its ``configure(config)`` method, called for the selected
    components only. This hook is for what no one component owns -- a rule between options
    of several groups, a site policy -- and sees every run's whole config. Raise
    :class:`ddlkit.ConfigError` with a message that names the key and the fix. Example::

        @ddlkit.hookimpl
        def ddlkit_configure(config):
            if config.compute.name == "slurm" and config.storage.name == "local":
                raise ddlkit.ConfigError("compute=slurm writes results on the cluster: use storage=nfs")

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_job_environment(config: DictConfig) -> Mapping[str, str] | None:
    """Environment variables the ranks of this job need, read in the launcher.

    The ranks may run on another machine that does not share the launcher's environment, so
    whatever a plugin reads from the environment on the rank side must be passed on here. The
    results of all plugins are merged into the job's :attr:`ddlkit.JobSpec.env`; variables
    whose names look secret (``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_CONNECTION_STRING``,
    ``*_PASSWORD``, ...) go to :attr:`ddlkit.JobSpec.secret_env` instead, which a compute target
    passes through its secret channel and never writes to a file. Example::

        @ddlkit.hookimpl
        def ddlkit_job_environment(config):
            if config.storage.name == "azure":
                return {k: v for k, v in os.environ.items() if k.startswith("AZURE_STORAGE_")}

    .. versionadded:: 0.2
    """


@hookspec(firstresult=True)
def ddlkit_run_loop(run: RunContext) -> bool | None:
    """Drive one rank's training. The default is ``ddlkit.builtin.run_loop``.

    Stops at the first non-None result. Wrap the default for timing or profiling::

        @ddlkit.hookimpl(wrapper=True)
        def ddlkit_run_loop(run):
            t0 = time.perf_counter()
            result = yield
            print("run loop took", time.perf_counter() - t0)
            return result

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_run_start(run: RunContext) -> None:
    """Called on every rank after components are built and state is restored, before the first step.

    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_step_end(run: RunContext, step: int, metrics: Mapping[str, float]) -> None:
    """Called on every rank at each logging step (every ``trainer.log_every`` steps).

    :param step: global optimizer step, counted from 1 across epochs and resumes.
    :param metrics: ``loss``, ``lr``, ``images_per_sec`` (this rank's view), ``epoch``.
    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_epoch_end(run: RunContext, epoch: int, metrics: Mapping[str, float]) -> None:
    """Called on every rank after each epoch's validation.

    :param epoch: 1-based number of the epoch just finished.
    :param metrics: ``val_loss``, ``val_top1``, ``val_top5`` and the epoch's ``train_loss``.
    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_checkpoint_saved(run: RunContext, path: str, step: int) -> None:
    """Called on rank 0 after a checkpoint was written atomically to ``path`` and is the latest.

    :param step: the step the checkpoint holds. A checkpoint written in the background
        (``trainer.checkpoint_async``) is announced, on the training thread, at the first step
        boundary after it is complete, so ``run.state.step`` may be later than ``step``.
    .. versionadded:: 0.1
    """


@hookspec
def ddlkit_run_end(run: RunContext, status: RunStatus, result: Mapping[str, Any] | None) -> None:
    """Called on every rank when the run ends, whatever the outcome.

    :param status: ``completed``, ``failed`` or ``interrupted``.
    :param result: the content of ``result.json`` when completed, else None.
    .. versionadded:: 0.1
    """
