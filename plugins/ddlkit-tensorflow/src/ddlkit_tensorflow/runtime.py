"""Process-wide TensorFlow/Keras setup and the distribution seam, shared by ``framework=tensorflow``
and ``framework=keras``.

Nothing here imports TensorFlow or Keras at module level: ``plugin.py`` and ``framework.py``
import this module while ddlkit composes and validates configs, which must stay fast and must
work where TensorFlow is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import ddlkit
from ddlkit import cpu, threads
from ddlkit.horovod import horovod_built_with

if TYPE_CHECKING:
    from omegaconf import DictConfig

INSTALL_HINT = "pip install tensorflow-cpu==2.21.0 (CPU only) or tensorflow[and-cuda]==2.21.0 (GPU)"

#: trainer.precision -> Keras dtype policy
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}

#: framework.device choices
DEVICES = ("auto", "cpu", "gpu")


#: what TensorFlow's C++ prints while it loads, before any log level applies
LOAD_NOTICES = re.compile(r"All log messages before absl::InitializeLog\(\) is called|oneDNN custom operations are on")


def import_tensorflow(framework: str) -> ModuleType:
    """``import tensorflow``, or a ConfigError that says what to install."""
    # TF's C++ log lines repeat what its Python errors say, around ddlkit's own one-line errors
    # (a corrupt image: libjpeg's complaint, then a rendezvous aborting), and its INFO lines
    # would open every rank log; a user who wants them sets the variable (0: everything)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        with _without_load_notices():
            import tensorflow as tf
    except ImportError as err:
        raise ddlkit.ConfigError(f"framework={framework} needs TensorFlow, which cannot be imported here ({err}). "
                                 f"Install it: {INSTALL_HINT}.") from None
    return tf


@contextlib.contextmanager
def _without_load_notices() -> Iterator[None]:
    """Drop the notices TensorFlow's C++ writes to stderr while it loads (:data:`LOAD_NOTICES`:
    absl's, then oneDNN's, each twice), which no log level silences; pass on anything else."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", errors="replace")
            sys.stderr.write("".join(line for line in text.splitlines(keepends=True) if not LOAD_NOTICES.search(line)))
            sys.stderr.flush()


def check_config(framework: str, device: str, xla: bool, num_threads: Any, config: DictConfig) -> None:
    """Launcher-side checks that need no TensorFlow (``Framework.configure``); the framework's own
    options come from its component config, the rest from the run's ``config``."""
    if config.dist.backend == "horovod":
        raise ddlkit.ConfigError(horovod_refusal(framework))
    threads.check(num_threads, "TensorFlow")
    if xla and config.trainer.deterministic:
        raise ddlkit.ConfigError(f"framework.xla=true cannot run with trainer.deterministic=true: XLA has no "
                                 f"deterministic max-pool gradient. Choose one of the two for framework={framework}.")
    if device not in DEVICES:
        raise ddlkit.ConfigError(f"framework.device={device} is invalid: choose one of {', '.join(DEVICES)}.")
    if config.trainer.precision == "fp16" and device == "cpu":
        raise cpu.fp16_refusal(framework, "framework.device=cpu was chosen")


def setup_tensorflow(run: ddlkit.RunContext, *, framework: str, device: str, num_threads: Any) -> ModuleType:
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
    precision = run.cfg.trainer.precision
    if precision == "fp16" and not gpus:
        raise cpu.fp16_refusal(framework, "TensorFlow sees none here")
    if not gpus and run.dist.is_main and (slow := cpu.bf16_warning(precision)):
        print(f"ddlkit: warning: {slow}", file=sys.stderr, flush=True)
    run.num_threads = _set_threads(tf, threads.per_rank(num_threads, run.dist.local_size))
    import keras

    # Python's random, NumPy and TensorFlow's global seed: model initialisation repeats exactly
    keras.utils.set_random_seed(t.seed)
    if t.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(POLICIES[precision])
    return tf


def _set_threads(tf: ModuleType, wanted: int) -> int:
    """Set TensorFlow's intra-op thread pool to ``wanted`` threads (0: TensorFlow's default, one per
    core it sees) and return how many it uses. TensorFlow fixes the pool when its runtime starts: a
    rank is a fresh process, so this always applies there; a second run in one process (a notebook,
    an in-process test) keeps the first run's pool, and is told so instead of failing."""
    current = tf.config.threading.get_intra_op_parallelism_threads()
    if wanted and wanted != current:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(wanted)
            current = wanted
        except RuntimeError:
            print(f"ddlkit: warning: TensorFlow already started in this process with {current or 'its default'} "
                  f"intra-op threads, and keeps them (framework.num_threads asked for {wanted}); start a new "
                  f"process to change it", file=sys.stderr, flush=True)
    return current or os.cpu_count() or 1


def distribution_strategy(run: ddlkit.RunContext, framework: str) -> Any:
    """The seam between ddlkit's ``dist.backend`` and TensorFlow: the one place that decides
    how gradients are shared across ranks. The training code uses only the returned object's
    ``scope()`` / ``run()`` / ``reduce()`` / ``experimental_distribute_dataset()``, so adding a
    backend means adding a branch here, nowhere else:

    * ``none``, or a job of one rank: ``tf.distribute.get_strategy()``, the default strategy (one
      replica, no collectives; its methods cost nothing);
    * ``native``: ``tf.distribute.MultiWorkerMirroredStrategy`` (:class:`MultiWorker`), one worker
      per rank, ``TF_CONFIG`` built from the ranks' addresses;
    * ``horovod``: a ConfigError (:func:`check_config`): Horovod 0.28.1 does not build against
      TensorFlow >= 2.16, and this plugin targets Keras 3 on TensorFlow 2.21.

    It sets ``run.device`` to the devices the strategy computes on (:func:`device_names`).
    """
    backend = run.cfg.dist.backend
    if backend == "none" and run.dist.world_size != 1:
        raise ddlkit.ConfigError(f"dist.backend=none trains in one process, but this job has "
                                 f"{run.dist.world_size} ranks; use dist.backend=native.")
    if backend == "horovod":
        raise ddlkit.ConfigError(horovod_refusal(framework))
    if backend not in ("none", "native"):
        raise ddlkit.ConfigError(f"dist.backend={backend} is unknown: choose none, native or horovod.")
    import tensorflow as tf

    if run.dist.world_size == 1:
        # the default strategy places every op on the first GPU TensorFlow sees, else on the CPU
        run.device = device_names(tf.config.list_logical_devices("GPU")[:1] or tf.config.list_logical_devices("CPU"))
        return tf.distribute.get_strategy()
    strategy = MultiWorker(run)
    run.device = device_names(strategy.strategy.extended.worker_devices)
    return strategy


def device_names(devices: Any) -> str:
    """TensorFlow's devices (``LogicalDevice`` records or names such as ``/job:worker/task:0/device:GPU:0``)
    in ``result.json``'s terms (``ddlkit.result``), the same as PyTorch's: "cpu", "cuda:<index>", comma-separated."""
    import tensorflow as tf

    names = []
    for device in devices:
        spec = tf.DeviceSpec.from_string(getattr(device, "name", device))
        # TensorFlow's GPU builds are CUDA builds: its GPUs get torch's name
        names.append(f"cuda:{spec.device_index}" if spec.device_type == "GPU" else spec.device_type.lower())
    return ",".join(dict.fromkeys(names))  # once each, in order


#: why Horovod does not train with this plugin, and what to use instead
HOROVOD_HOW_TO = ("Horovod 0.28.1, its last release, does not build against TensorFlow >= 2.16: use dist=native "
                  "(tf.distribute.MultiWorkerMirroredStrategy), or an environment pinned to tensorflow 2.15 + "
                  "horovod 0.28.1 (see the README, 'Horovod').")


def horovod_refusal(framework: str) -> str:
    """Why ``dist=horovod`` is refused for ``framework`` (tensorflow or keras), in the terms of
    the Horovod installed here."""
    built = horovod_built_with("tensorflow/mpi_lib")
    if built is None:
        return f"dist=horovod with framework={framework} needs Horovod, which is not installed. {HOROVOD_HOW_TO}"
    if not built:
        return (f"dist=horovod with framework={framework}: the installed Horovod was built without TensorFlow "
                f"support. {HOROVOD_HOW_TO}")
    # a Horovod built with TensorFlow: only possible with TensorFlow <= 2.15
    return (f"dist=horovod is not supported for framework={framework}: this plugin targets Keras 3 "
            "(TensorFlow >= 2.16), which Horovod 0.28.1 does not build against. Use dist=native.")


class MultiWorker:
    """``tf.distribute.MultiWorkerMirroredStrategy`` over the job's ranks, one worker each.

    ``TF_CONFIG`` is built here rather than by the launcher: each rank picks a free port on its
    host and the ranks exchange ``host:port`` over ddlkit's control plane, so the same code runs
    under local_mpi (all on 127.0.0.1), a cluster's mpirun or torchrun. The strategy must exist
    before TensorFlow runs any op, so this is created right after :func:`setup_tensorflow`.

    The only difference from the strategy itself: :meth:`experimental_distribute_dataset` takes
    this rank's own dataset as it is. ddlkit's loaders already give every rank its own shard in
    per-rank batches, while TensorFlow's method would shard the dataset again across workers and
    re-split each batch, taking it for a global batch.
    """

    def __init__(self, run: ddlkit.RunContext) -> None:
        import tensorflow as tf

        host = "127.0.0.1" if _all_on_this_host() else socket.gethostname()
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        workers = run.dist.allgather(f"{host}:{port}")
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                              "task": {"type": "worker", "index": run.dist.rank}})
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def scope(self) -> Any:
        return self.strategy.scope()

    def run(self, fn: Any, args: tuple = ()) -> Any:
        return self.strategy.run(fn, args=args)

    def reduce(self, op: Any, value: Any, axis: Any) -> Any:
        return self.strategy.reduce(op, value, axis=axis)

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        import tensorflow as tf

        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return self.strategy.distribute_datasets_from_function(lambda context: dataset.with_options(options))


def _all_on_this_host() -> bool:
    """Whether the rendezvous address is loopback, i.e. every rank runs on this machine."""
    host = os.environ.get("MASTER_ADDR", "")
    return host == "localhost" or host.startswith("127.") or host == "::1"
