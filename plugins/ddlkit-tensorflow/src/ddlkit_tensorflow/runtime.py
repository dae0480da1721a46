"""Process-wide TensorFlow/Keras setup and the distribution seam, shared by ``framework=tensorflow``
and ``framework=keras``.

Nothing here imports TensorFlow or Keras at module level: ``plugin.py`` and ``framework.py``
import this module while ddlkit composes and validates configs, which must stay fast and must
work where TensorFlow is not installed.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

import ddlkit

if TYPE_CHECKING:
    from omegaconf import DictConfig

INSTALL_HINT = "pip install tensorflow-cpu==2.21.0 (CPU only) or tensorflow[and-cuda]==2.21.0 (GPU)"

#: trainer.precision -> Keras dtype policy
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}

#: framework.device choices
DEVICES = ("auto", "cpu", "gpu")


def import_tensorflow(framework: str) -> ModuleType:
    """``import tensorflow``, or a ConfigError that says what to install."""
    # TF's C++ INFO lines (oneDNN notices, CPU feature lists) would open every rank log; keep
    # warnings and errors, and leave the user's own setting alone
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ddlkit.ConfigError(f"framework={framework} needs TensorFlow, which cannot be imported here ({err}). "
                                 f"Install it: {INSTALL_HINT}.") from None
    return tf


def precision_of(config: DictConfig) -> str:
    """``trainer.precision`` as ``fp32|bf16|fp16``: the launcher's composed config holds an enum
    member (whose ``str()`` is ``Precision.fp16``), the worker's job file a plain string."""
    precision = config.trainer.precision
    return str(getattr(precision, "value", precision))


def check_config(framework: str, device: str, xla: bool, config: DictConfig) -> None:
    """Launcher-side checks that need no TensorFlow (``Framework.configure``)."""
    if xla and config.trainer.deterministic:
        raise ddlkit.ConfigError(f"framework.xla=true cannot run with trainer.deterministic=true: XLA has no "
                                 f"deterministic max-pool gradient. Choose one of the two for framework={framework}.")
    if device not in DEVICES:
        raise ddlkit.ConfigError(f"framework.device={device} is invalid: choose one of {', '.join(DEVICES)}.")
    if precision_of(config) == "fp16" and device == "cpu":
        raise ddlkit.ConfigError(f"trainer.precision=fp16 needs a GPU (framework.device=cpu was chosen); "
                                 f"on the CPU use trainer.precision=bf16 (or fp32) with framework={framework}.")


def setup_tensorflow(run: ddlkit.Run, *, framework: str, device: str, num_threads: int) -> ModuleType:
    """Apply the settings TensorFlow only accepts before its runtime starts (devices, threads,
    determinism), seed every generator, set the precision policy; return the ``tensorflow`` module.

    Call first thing in ``train()``, before any tensor exists.
    """
    t = run.cfg.trainer
    tf = import_tensorflow(framework)
    if device == "cpu":
        tf.config.set_visible_devices([], "GPU")
    gpus = tf.config.get_visible_devices("GPU")
    if device == "gpu" and not gpus:
        raise ddlkit.ConfigError(f"framework.device=gpu but TensorFlow sees no GPU here (is tensorflow-cpu "
                                 f"installed?); use framework.device=auto or cpu with framework={framework}.")
    precision = precision_of(run.cfg)
    if precision == "fp16" and not gpus:
        raise ddlkit.ConfigError(f"trainer.precision=fp16 needs a GPU and TensorFlow sees none; on the CPU use "
                                 f"trainer.precision=bf16 (or fp32) with framework={framework}.")
    if num_threads:
        tf.config.threading.set_intra_op_parallelism_threads(num_threads)
    import keras

    # Python's random, NumPy and TensorFlow's global seed: model initialisation repeats exactly
    keras.utils.set_random_seed(t.seed)
    if t.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(POLICIES[precision])
    return tf


def distribution_strategy(run: ddlkit.Run, framework: str) -> Any:
    """The seam between ddlkit's ``dist.backend`` and TensorFlow: the one place that decides
    how gradients are shared across ranks. The training code uses only the returned object's
    ``scope()`` / ``run()`` / ``reduce()`` / ``experimental_distribute_dataset()``, so adding a
    backend means adding a branch here, nowhere else:

    * ``none``: ``tf.distribute.get_strategy()``, the default strategy (one replica, no
      collectives; its methods cost nothing);
    * ``native``: ``tf.distribute.MultiWorkerMirroredStrategy`` with a cluster resolver built
      from ``run.dist`` (rank, world size), as the local_mpi compute target will launch it;
    * ``horovod``: an object with the same four methods over ``hvd.DistributedGradientTape`` /
      ``hvd.DistributedOptimizer`` and ``hvd.broadcast_variables`` of the initial state.
      (Horovod 0.28.1 does not build against TensorFlow >= 2.16; see the README.)
    """
    backend = run.cfg.dist.backend
    if backend == "none":
        if run.dist.world_size != 1:
            raise ddlkit.ConfigError(f"dist.backend=none trains in one process, but this job has "
                                     f"{run.dist.world_size} ranks; use dist.backend=native.")
        import tensorflow as tf

        return tf.distribute.get_strategy()
    if backend in ("native", "horovod"):
        raise ddlkit.ConfigError(f"dist.backend={backend} for framework={framework} arrives with the local_mpi "
                                 "compute target; use dist.backend=none (one process) until then.")
    raise ddlkit.ConfigError(f"dist.backend={backend} is unknown: choose none, native or horovod.")
