"""Config schemas, and how plugin schemas reach Hydra.

Every option of every group is a structured config in Hydra's ConfigStore: the core's own
(trainer, dist, sweep) from this module, and each plugin's from its
:class:`~ddlkit.Registration` ``config`` dataclass, stored as ``<group>/<name>``. A plugin
therefore adds options to a group without touching ``conf/``, and values are type-checked
when Hydra composes. ``conf/config.yaml`` holds only the defaults list and Hydra settings.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from .checkpoint import CHECKSUMS
from .errors import ConfigError
from .options import NON_NEGATIVE, POSITIVE, POSITIVE_INTEGER, Rule, at_least, checked, one_of
from .registry import HOOK_POINTS, Registry
from .resize import ON_RESIZE

if TYPE_CHECKING:
    from hydra.core.config_store import ConfigStore

CONF_DIR = Path(__file__).parent / "conf"
#: experiment configs are looked up here (relative to the working directory) and in $DDLKIT_EXPERIMENTS
EXPERIMENTS_DIR = "experiments"
#: the user's own config directory beside their code (relative to the working directory), searched
#: like ``--config-dir``: presets (``conf/compute/mycluster.yaml``) and experiments (``conf/experiment/``)
USER_CONF_DIR = "conf"
#: dist.backend: one process (none), the framework's own collectives (native), Horovod, or the
#: framework's sharded data parallelism (fsdp: parameters, gradients and optimizer state split over
#: the ranks; frameworks say which they train with, ``Framework.backends``)
BACKENDS = ("none", "native", "horovod", "fsdp")


class Precision(enum.StrEnum):
    """``trainer.precision``. A StrEnum, as every enum of a config schema: a member reads as its
    name wherever a string is wanted (a message, a framework's dtype table, result.json)."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@dataclass
class EarlyStoppingConfig:
    # the validation metric to watch (val_loss, val_top1, val_top5, or val_<name> of model.metrics);
    # null: train all epochs
    monitor: str | None = None
    # min or max: which way is better; auto: max for val_top1/val_top5, min for val_loss
    mode: str = "auto"
    # stop after this many validations in a row without an improvement
    patience: int = checked(3, at_least(0, ">= 0 (validations in a row without an improvement before the run stops)"))
    # a change of at most this much is no improvement
    min_delta: float = checked(0.0, NON_NEGATIVE)


@dataclass
class BestCheckpointConfig:
    # the validation metric whose best value's checkpoint is kept as checkpoints/best.ckpt; null: none kept
    monitor: str | None = None
    # min or max: which way is better; auto: max for val_top1/val_top5, min for val_loss
    mode: str = "auto"


@dataclass
class ProfileConfig:
    """``trainer.profile``: the framework's profiler over a window of optimizer steps
    (:mod:`ddlkit.rank.profiling`); every rank writes its trace into the job directory's ``profile/``."""

    # the first optimizer step profiled (1-based); null or 0: no profiler (the default)
    start_step: int | None = checked(None, at_least(0, "null, 0 (off) or a step number >= 1"))
    # how many optimizer steps the window holds, from start_step on
    num_steps: int = checked(5, POSITIVE_INTEGER)


@dataclass
class TrainerConfig:
    # passes over the training data
    epochs: int = checked(2, POSITIVE_INTEGER)
    # images per rank per step; the global batch is batch_size x world size
    batch_size: int = checked(32, POSITIVE_INTEGER)
    # stop after this many optimizer steps in total (like tf_cnn_benchmarks' num_batches); null = all epochs
    max_steps: int | None = checked(None, at_least(1, "null or a positive integer"))
    # log (and compute a host-side loss) every N steps
    log_every: int = checked(10, POSITIVE_INTEGER)
    # steps excluded from images/sec at the start (and after each resume)
    warmup_steps: int = checked(5, NON_NEGATIVE)
    # also checkpoint every N steps (0 = at the end of each epoch and of training only)
    checkpoint_every: int = checked(0, at_least(0, ">= 0 (0 = per epoch)"))
    # how many step checkpoints stay in checkpoints/: the oldest beyond it is removed (the best one is kept apart)
    keep_checkpoints: int = checked(2, POSITIVE_INTEGER)
    # write the checkpoints in the middle of training on a background thread, where the framework
    # can copy its state (PyTorch): the training thread pays only for the copy, which stays in host
    # memory (one model + optimizer state). The run's last checkpoint is always written at once.
    checkpoint_async: bool = True
    # what each checkpoint's manifest keeps of its files' content: crc32 (detects a damaged
    # checkpoint, fast) or sha256 (also identifies its bytes, for provenance; 8x slower here)
    checkpoint_checksum: str = checked("crc32", one_of(tuple(CHECKSUMS)))
    # auto: continue from the job directory's last checkpoint if any; true: require one;
    # false: start fresh; or a path to a checkpoint (file, or a job directory)
    resume: str = "auto"
    # the training precision: fp32, or bf16 / fp16 mixed precision as each framework implements it
    precision: Precision = Precision.fp32
    # every generator's seed (NumPy's takes 32 bits)
    seed: int = checked(0, Rule(lambda v: 0 <= v < 2**32, "an integer in [0, 4294967295]"))
    # deterministic kernels (CPU results then repeat bit for bit; slower on GPU)
    deterministic: bool = False
    # run validation after each epoch
    validate: bool = True
    # write the trained weights to model.<ext> in the job directory at the end
    save_model: bool = True
    # clip the gradient's global L2 norm (over all parameters) to this value before each optimizer
    # step: after the ranks' all-reduce (and under fp16 after unscaling); null or 0: no clipping
    clip_grad_norm: float | None = checked(None, at_least(0, "null, 0 (no clipping) or a positive gradient norm"))
    # micro-batches of batch_size per optimizer step: the global batch is batch_size x world size x
    # accumulate_batches (steps, learning-rate scaling, logging and images/sec count optimizer steps)
    accumulate_batches: int = checked(
        1, at_least(1, "a positive integer (micro-batches per optimizer step; 1 = none accumulated)")
    )
    # when an elastic job (compute.min_nodes) runs on fewer or more ranks than planned: keep_global_batch
    # (each rank takes a larger share of the same global batch: the same optimisation) or scale_lr (each rank
    # keeps trainer.batch_size; the learning rate follows the global batch by optimizer.scale_lr)
    on_resize: str = checked("keep_global_batch", one_of(ON_RESIZE))
    # the largest per-rank micro-batch that fits, for keep_global_batch on fewer ranks: beyond it, gradients
    # are accumulated; null: trainer.batch_size (a rank's share grows by accumulation only)
    max_batch_size: int | None = checked(None, at_least(1, "null or a positive integer"))
    # stop when a validation metric stops improving (trainer.early_stopping.monitor=val_loss)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    # keep the checkpoint of the best validation (trainer.best_checkpoint.monitor=val_top1)
    best_checkpoint: BestCheckpointConfig = field(default_factory=BestCheckpointConfig)
    # profile optimizer steps start_step .. start_step + num_steps - 1 with the framework's profiler
    # (trainer.profile.start_step=20): a trace per rank in the job directory's profile/
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    # your callbacks, as import paths like model.target: trainer.callbacks=[my_pkg.cbs:PrintLr], each a
    # class (called with no arguments) or object with any of the methods on_run_start, on_step_end,
    # on_epoch_end, on_checkpoint_saved, on_run_end (see ddlkit.callbacks)
    callbacks: list[str] = field(default_factory=list)


#: sweep.early_stopping.scheduler: every trial to its end; asynchronous successive halving; median
#: stopping; Optuna's pruners (hydra/sweeper=optuna_pruning)
EARLY_STOPPING_SCHEDULERS = ("none", "asha", "median", "optuna")
#: sweep.early_stopping.unit: what grace, max_t and the rungs count
BUDGET_UNITS = ("epochs", "steps")


@dataclass
class SweepEarlyStoppingConfig:
    """Stop a sweep's bad trials early (``ddlkit.launch.sweep.halving``). Each trial runs in segments,
    from rung to rung (grace x reduction_factor^k epochs or steps, up to max_t), each ending with a
    checkpoint; at a rung the launcher compares it with the trials that reached that rung before it."""

    # none: every trial runs to its end; asha: a trial not in the top 1/reduction_factor of its rung
    # is paused there, with its checkpoint, and promoted later (resumed, not recomputed) if it
    # qualifies; median: a trial whose best so far is worse than the median of the others' at the
    # same rung is stopped for good (pruned); optuna: with hydra/sweeper=optuna_pruning, every grace
    # epochs (or steps) the study's pruner (hydra.sweeper.pruner) decides
    scheduler: str = checked("none", one_of(EARLY_STOPPING_SCHEDULERS))
    # what the trials are compared by: a metric their metrics.jsonl logs (logger=jsonl): val_top1,
    # val_top5, val_loss (or val_<name> of model.metrics), loss; its last value when a trial reaches a rung
    metric: str = "val_top1"
    # max or min: which way is better; auto: max for val_top1 and val_top5, min for val_loss and loss
    mode: str = checked("auto", one_of(("auto", "max", "min")))
    # what grace and max_t count: epochs (trainer.epochs) or optimizer steps (trainer.max_steps)
    unit: str = checked("epochs", one_of(BUDGET_UNITS))
    # the first rung: epochs (or steps) every trial runs before it can be stopped
    grace: int = checked(1, POSITIVE_INTEGER)
    # the rungs are grace x reduction_factor^k; asha keeps the top 1/reduction_factor of each rung
    reduction_factor: int = checked(3, at_least(2, "an integer >= 2"))
    # a trial's full budget; null: the trials' trainer.epochs (unit=epochs) or trainer.max_steps (steps)
    max_t: int | None = checked(None, at_least(1, "null or a positive integer"))
    # median: the others that must have reached a rung before a trial can be stopped there
    min_samples: int = checked(3, POSITIVE_INTEGER)


@dataclass
class SweepConfig:
    # `ddlkit -m`: jobs in flight at once, each a separate job on the compute target
    max_parallel: int = 2
    # keep-going, fail-fast, or retry:N (re-run a failed job up to N times; it resumes from its checkpoint)
    on_failure: str = "keep-going"
    # the sweep report's sort key and plotted metric: best_top1, final_loss, images_per_sec or duration_s
    sort_by: str = "best_top1"
    # with a search sweeper (hydra/sweeper=optuna): the result field each job reports to it, e.g.
    # best_top1, final_loss, images_per_sec (null: the basic sweeper, which optimizes nothing)
    objective: str | None = None
    # maximize, minimize, or auto: the objective's natural direction (best_top1 up, final_loss down)
    direction: str = "auto"
    # stop bad trials early: successive halving (asha) or median stopping (see SweepEarlyStoppingConfig)
    early_stopping: SweepEarlyStoppingConfig = field(default_factory=SweepEarlyStoppingConfig)


@dataclass
class RestartConfig:
    """What the launcher does when a job ends because of the infrastructure (a rank or node lost,
    a preemption, a silent rank): start it again in the same job directory, where it resumes from
    its newest verified checkpoint (``ddlkit.compute.restarts``). A failure of the job's own code
    or config is never restarted."""

    # restarts of one job; null: the compute target's default (0 for compute=local, 3 for cluster targets)
    max_restarts: int | None = checked(None, at_least(0, "null or >= 0"))
    # seconds before the first restart, doubled for each one after it (a lost node needs time to be replaced)
    backoff_s: float = checked(10.0, NON_NEGATIVE)
    # seconds a restart waits for compute.min_nodes (null: compute.nodes) of the job's nodes to be up when
    # fewer are (asking the target at its poll interval, saying so), before the job fails; null: the compute
    # target's default (600 for cluster targets, 0 for compute=local and local_mpi)
    capacity_wait_s: float | None = checked(None, at_least(0, "null or >= 0 (seconds)"))


@dataclass
class CodeConfig:
    """The snapshot of the launch directory that ships with a job to ranks that do not see the
    launcher's disk (``ddlkit.compute.snapshot``)."""

    # the most the snapshot may hold, in MB (10^6 bytes): over it, the job is refused with the biggest files named
    max_mb: float = checked(50.0, POSITIVE)
    # more .gitignore-style patterns to leave out (beside .gitignore files and .ddlkitignore)
    exclude: list[str] = field(default_factory=list)


@dataclass
class DistConfig:
    # none: one process; native: the framework's collectives (torch.distributed, tf.distribute);
    # horovod: Horovod (scripts/install_horovod.sh); fsdp: PyTorch's fully sharded data parallelism
    # (each rank holds 1/N of the parameters, gradients and optimizer state; sharded checkpoints)
    backend: str = checked("none", one_of(BACKENDS))
    # seconds a rank waits in a collective for the slowest rank before the job fails (at most
    # 2147483: gloo and NCCL count it in milliseconds in 32 bits, about 24.8 days)
    timeout_s: float = checked(1800.0, Rule(lambda v: 0 < v <= 2_147_483, "positive and at most 2147483 (seconds)"))
    # seconds without a heartbeat from a rank (stopped, hung) before the others say so, and
    # again after each further such period; a slow but live rank keeps sending them
    warn_after_s: float = checked(60.0, at_least(1, "at least 1 (seconds)"))
    # each rank times its steps' phases (data wait, compute, waits for the others); rank 0 gathers them every
    # trainer.log_every steps: per-rank metrics, telemetry.json (ddlkit jobs status), the straggler verdict
    telemetry: bool = True
    # when a rank is silent for warn_after_s, every rank that answers writes the Python stacks of all its
    # threads (and native frames, where py-spy is installed) to <job dir>/hang/rank-N.txt
    hang_stacks: bool = True
    # a rank whose own time per step (its step less its waits for the others) stays at least this many
    # times the median of the other ranks' over straggler_window steps is named a straggler (0: never)
    straggler_factor: float = checked(1.2, Rule(lambda v: v == 0 or v > 1, "0 (off) or more than 1"))
    # the steps that verdict looks back over (a rank's summary is gathered every trainer.log_every steps)
    straggler_window: int = checked(50, POSITIVE_INTEGER)
    # ranks agree every N steps whether one of them got SIGTERM, and then all stop at that step
    stop_check_every: int = checked(1, POSITIVE_INTEGER)


#: the config's top-level keys besides the hook points, and their schemas
CORE_SCHEMAS: dict[str, type] = {
    "trainer": TrainerConfig,
    "dist": DistConfig,
    "sweep": SweepConfig,
    "code": CodeConfig,
    "restart": RestartConfig,
}


def named_schema(schema: type | None, name: str) -> type:
    """The plugin's schema plus a ``name`` field holding the option's name, so that the
    resolved job file says which implementation each group selected."""
    base: tuple[type, ...] = (schema,) if schema is not None else ()
    cls_name = f"{schema.__name__ if schema else 'Empty'}_{name}"
    return dataclasses.make_dataclass(cls_name, [("name", str, field(default=name))], bases=base)


def _named_option(registry: Registry, group: str, name: str) -> type:
    return named_schema(registry.get(group, name).config, name)


def store_schemas(registry: Registry, cs: ConfigStore | None = None) -> None:
    """Put every option of every group into Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore  # the launcher's: a rank never imports Hydra

    cs = cs or ConfigStore.instance()
    for group, hp in HOOK_POINTS.items():
        options = cs.repo.setdefault(group, {})
        for name in registry.names(group):
            # the plugin's schema is imported (where it names it by "module:attr") when Hydra reads the option
            schema = functools.partial(_named_option, registry, group, name)
            # loggers are multi-select: nest each under its own name (logger.console, logger.jsonl)
            options[f"{name}.yaml"] = _lazy_node(
                f"{name}.yaml", schema, group=group, package=f"{group}.{name}" if hp.multi else group
            )
    # the core's own too: Hydra deep-copies the whole store before it composes, a built node dearly
    core: dict[str, dict[str, Callable[[], Any]]] = {
        "trainer": {"default": TrainerConfig},
        "sweep": {"default": SweepConfig},
        "code": {"default": CodeConfig},
        "restart": {"default": RestartConfig},
        "dist": {backend: functools.partial(DistConfig, backend=backend) for backend in BACKENDS},
    }
    for group, options in core.items():
        for name, schema in options.items():
            cs.repo.setdefault(group, {})[f"{name}.yaml"] = _lazy_node(
                f"{name}.yaml", schema, group=group, package=None
            )


def _lazy_node(name: str, schema: Callable[[], Any], *, group: str, package: str | None) -> Any:
    """A ConfigStore entry, as ``ConfigStore.store`` makes one, whose config is built from
    ``schema()`` when Hydra first reads it. ``store`` turns its node into a DictConfig at once,
    and a command composes a handful of the ~50 options the plugins register: building them all
    was a fifth of ``ddlkit --cfg job``'s start-up (issue 29, item 3). A plugin's schema that
    OmegaConf refuses then fails when its option is chosen, not every run."""
    return _lazy_node_type()(name=name, node=schema, group=group, package=package, provider="ddlkit")


@functools.cache
def _lazy_node_type() -> type:
    from hydra.core.config_store import ConfigNode  # the launcher's: a rank never imports Hydra

    class LazyConfigNode(ConfigNode):
        """``node`` is built on first read; Hydra's ``ConfigStore.load`` copies the entry and
        deep-copies its node, so the one built here is never changed."""

        def __init__(
            self, *, name: str, node: Callable[[], Any], group: str, package: str | None, provider: str
        ) -> None:
            self.__dict__.update(name=name, group=group, package=package, provider=provider, _schema=node)

        @property  # type: ignore[override]
        def node(self) -> DictConfig:
            if "_node" not in self.__dict__:
                self.__dict__["_node"] = OmegaConf.structured(self.__dict__["_schema"]())
            return self.__dict__["_node"]

        @node.setter
        def node(self, value: DictConfig) -> None:
            self.__dict__["_node"] = value

        def __deepcopy__(self, memo: dict[int, Any]) -> LazyConfigNode:
            # Hydra deep-copies the whole ConfigStore: the schema's maker (which holds the registry, and
            # through it the plugin modules) is shared, not copied
            clone = object.__new__(type(self))
            clone.__dict__.update(
                {k: v if k == "_schema" else copy.deepcopy(v, memo) for k, v in self.__dict__.items()}
            )
            return clone

    return LazyConfigNode


def experiment_dirs() -> list[Path]:
    """The directories whose ``<name>.yaml`` files are ``+experiment=<name>``: ``./experiments``, then
    ``$DDLKIT_EXPERIMENTS``. Hydra reads them through ``hydra_plugins/ddlkit_searchpath``, a file only
    when it is selected."""
    dirs = [Path(EXPERIMENTS_DIR)]
    dirs += [Path(p) for p in os.environ.get("DDLKIT_EXPERIMENTS", "").split(os.pathsep) if p]
    return [d.resolve() for d in dirs if d.is_dir()]


def user_conf_dirs() -> list[Path]:
    """``./conf`` when there is one: searched for presets and experiments like a ``--config-dir``."""
    return [Path(USER_CONF_DIR).resolve()] if Path(USER_CONF_DIR).is_dir() else []


def yaml_error_line(err: BaseException) -> str:
    """A YAML parse error (several lines, with a caret under the spot) as one line naming the spot."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def to_container(cfg: Any) -> Any:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)


def rebuild(
    plain: Mapping[str, Any],
    registry: Registry,
    groups: Collection[str] | None = None,
    *,
    as_given: Collection[str] = (),
) -> DictConfig:
    """The typed config again, from its resolved copy in a job file (``job.json``'s ``config``):
    every group merged onto the schema it was composed from -- the core's for trainer, dist and
    sweep, the selected option's (found by its ``name``) for the others. A rank and ``ddlkit jobs``
    then hold the types the launcher validated (an enum field holds its member, not its name).
    ``groups``: only these (``ddlkit jobs`` needs the compute target's: it reaches a job from a
    shell that need not load the job's other plugins). ``as_given``: groups kept as the file has
    them, untyped (a rank never builds its compute target, whose plugin need not be installed where
    the ranks run)."""
    typed: dict[str, Any] = {}
    for group, node in plain.items():
        if groups is not None and group not in groups:
            continue
        if group in as_given:
            typed[group] = node
            continue
        if group in CORE_SCHEMAS:
            typed[group] = OmegaConf.merge(OmegaConf.structured(CORE_SCHEMAS[group]), node)
        elif HOOK_POINTS[group].multi:
            typed[group] = {key: _component(registry, group, option) for key, option in node.items()}
        else:
            typed[group] = _component(registry, group, node)
    return OmegaConf.create(typed)


def _component(registry: Registry, group: str, plain: Mapping[str, Any]) -> DictConfig:
    name = plain["name"]
    return OmegaConf.merge(OmegaConf.structured(named_schema(registry.get(group, name).config, name)), plain)


def check_one_global_batch(train_length: int, batch: int, accumulate: int, world_size: int) -> int:
    """The global batch (``batch`` per rank x ranks x ``accumulate`` micro-batches), or a
    ConfigError when ``train_length`` samples do not fill one. The ranks check it once their data
    is readable; the launcher asks here too where the data source states its length without
    reading any data (:meth:`ddlkit.DataSource.config_info`), before anything starts."""
    global_batch = batch * world_size * accumulate
    if train_length < global_batch:
        accumulated = f" x {accumulate} micro-batches" if accumulate > 1 else ""
        raise ConfigError(
            f"data has {train_length} training images, fewer than one global batch of {global_batch} "
            f"(trainer.batch_size={batch} x {world_size} ranks{accumulated}). Lower "
            f"trainer.batch_size{' or trainer.accumulate_batches,' if accumulated else ''} or raise data.length."
        )
    return global_batch
