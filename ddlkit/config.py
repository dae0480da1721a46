"""Config schemas, and how plugin schemas reach Hydra.

Every option of every group is a structured config in Hydra's ConfigStore: the core's own
(model, optimizer, trainer, dist) from this module, and each plugin's from its
:class:`~ddlkit.Registration` ``config`` dataclass, stored as ``<group>/<name>``. A plugin
therefore adds options to a group without touching ``conf/``, and values are type-checked
when Hydra composes. ``conf/config.yaml`` holds only the defaults list and Hydra settings.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from .distributed import BACKENDS
from .registry import HOOK_POINTS, Registry

CONF_DIR = Path(__file__).parent / "conf"
#: experiment configs are looked up here (relative to the working directory) and in $DDLKIT_EXPERIMENTS
EXPERIMENTS_DIR = "experiments"

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


class Precision(enum.Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@dataclass
class ModelConfig:
    # architecture; frameworks list the ones they build (`ddlkit plugins`)
    name: str = MISSING
    # start each residual block as identity (Goyal et al. sec. 5.1); helps large-batch training
    zero_init_residual: bool = False


@dataclass
class OptimizerConfig:
    name: str = "sgd"
    # learning rate for a global batch of `reference_batch`; scaled linearly with the real global batch
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    # scale lr by global_batch / reference_batch (Goyal et al.)
    scale_lr: bool = True
    reference_batch: int = 256
    # linear warm-up length in epochs (may be fractional)
    warmup_epochs: float = 5.0
    # epochs at which lr is multiplied by decay_factor
    decay_epochs: list[float] = field(default_factory=lambda: [30.0, 60.0, 80.0])
    decay_factor: float = 0.1
    label_smoothing: float = 0.0


@dataclass
class TrainerConfig:
    epochs: int = 2
    # images per rank per step; the global batch is batch_size x world size
    batch_size: int = 32
    # stop after this many optimizer steps in total (like tf_cnn_benchmarks' num_batches); null = all epochs
    max_steps: int | None = None
    # log (and compute a host-side loss) every N steps
    log_every: int = 10
    # steps excluded from images/sec at the start (and after each resume)
    warmup_steps: int = 5
    # also checkpoint every N steps (0 = at the end of each epoch and of training only)
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    # auto: continue from the job directory's last checkpoint if any; true: require one;
    # false: start fresh; or a path to a checkpoint (file, or a job directory)
    resume: str = "auto"
    precision: Precision = Precision.fp32
    seed: int = 0
    # deterministic kernels (CPU results then repeat bit for bit; slower on GPU)
    deterministic: bool = False
    # run validation after each epoch
    validate: bool = True
    # write the trained weights to model.<ext> in the job directory at the end
    save_model: bool = True


@dataclass
class SweepConfig:
    # `ddlkit -m`: jobs in flight at once, each a separate job on the compute target
    max_parallel: int = 2
    # keep-going, fail-fast, or retry:N (re-run a failed job up to N times; it resumes from its checkpoint)
    on_failure: str = "keep-going"
    # the sweep report's sort key and plotted metric: best_top1, final_loss, images_per_sec or duration_s
    sort_by: str = "best_top1"


@dataclass
class DistConfig:
    # none: one process; native: the framework's collectives (torch.distributed, tf.distribute);
    # horovod: Horovod (scripts/install_horovod.sh)
    backend: str = "none"
    # seconds a rank waits in a collective for the slowest rank before the job fails
    timeout_s: float = 1800.0
    # seconds without a heartbeat from a rank (stopped, hung) before the others say so, and
    # again after each further such period; a slow but live rank keeps sending them
    warn_after_s: float = 60.0
    # ranks agree every N steps whether one of them got SIGTERM, and then all stop at that step
    stop_check_every: int = 1


def _with_name(schema: type | None, name: str) -> type:
    """The plugin's schema plus a ``name`` field holding the option's name, so that the
    resolved job file says which implementation each group selected."""
    base: tuple[type, ...] = (schema,) if schema is not None else ()
    cls_name = f"{schema.__name__ if schema else 'Empty'}_{name}"
    return dataclasses.make_dataclass(cls_name, [("name", str, field(default=name))], bases=base)


def store_schemas(registry: Registry, cs: ConfigStore | None = None) -> None:
    """Put every option of every group into Hydra's ConfigStore (idempotent)."""
    cs = cs or ConfigStore.instance()
    for group, hp in HOOK_POINTS.items():
        for name in registry.names(group):
            node = _with_name(registry.get(group, name).config, name)
            # loggers are multi-select: nest each under its own name (logger.console, logger.jsonl)
            cs.store(group=group, name=name, node=node, package=f"{group}.{name}" if hp.multi else group)
    for model in MODELS:
        cs.store(group="model", name=model, node=ModelConfig(name=model))
    cs.store(group="optimizer", name="sgd", node=OptimizerConfig)
    cs.store(group="trainer", name="default", node=TrainerConfig)
    for backend in BACKENDS:
        cs.store(group="dist", name=backend, node=DistConfig(backend=backend))
    cs.store(group="sweep", name="default", node=SweepConfig)
    store_experiments(cs)


def experiment_dirs() -> list[Path]:
    dirs = [Path(EXPERIMENTS_DIR)]
    dirs += [Path(p) for p in os.environ.get("DDLKIT_EXPERIMENTS", "").split(os.pathsep) if p]
    return [d for d in dirs if d.is_dir()]


def store_experiments(cs: ConfigStore) -> None:
    """Expose ``experiments/<name>.yaml`` as ``+experiment=<name>`` (merged at the top level)."""
    for d in experiment_dirs():
        for path in sorted(d.glob("*.yaml")):
            cs.store(group="experiment", name=path.stem, node=OmegaConf.load(path), package="_global_")


def to_container(cfg: Any) -> Any:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)


def component_config(registry: Registry, group: str, plain: Any) -> Any:
    """A component's config node rebuilt from its resolved copy in a job file (``plain``, with
    its ``name``), typed by the component's schema again: enums are enums, not strings."""
    name = plain["name"]
    return OmegaConf.merge(OmegaConf.structured(_with_name(registry.get(group, name).config, name)), plain)
