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
from collections.abc import Callable, Iterator
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
        raise ddlkit.ConfigError(
            f"framework={framework} needs TensorFlow, which cannot be imported here ({err}). "
            f"Install it: {INSTALL_HINT}."
        ) from None
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
    threads.check(num_threads, "TensorFlow")
    if xla and config.trainer.deterministic:
        raise ddlkit.ConfigError(
            f"framework.xla=true cannot run with trainer.deterministic=true: XLA has no "
            f"deterministic max-pool gradient. Choose one of the two for framework={framework}."
        )
    if xla and config.dist.backend == "horovod":
        # XLA compiles the whole train step, Horovod's all-reduce included, and the Horovod that
        # scripts/install_horovod.sh builds has no XLA kernels (they are GPU-only, and do not build
        # against TensorFlow 2.21's XLA headers)
        raise ddlkit.ConfigError(
            f"framework.xla=true cannot run with dist=horovod: Horovod's collectives have no XLA "
            f"kernels here. Choose one of the two for framework={framework} (dist=native "
            f"compiles with XLA)."
        )
    if (config.get("data") or {}).get("decoder") == "gpu":
        raise ddlkit.ConfigError(
            f"data.decoder=gpu is PyTorch's (nvJPEG through torchvision); framework={framework} "
            "decodes its images in tf.data: use data.decoder=auto, or framework=pytorch."
        )
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
    run.phase("framework imported", say=False)
    if device == "cpu":
        tf.config.set_visible_devices([], "GPU")
    gpus = tf.config.get_visible_devices("GPU")
    if device == "gpu" and not gpus:
        raise ddlkit.ConfigError(
            f"framework.device=gpu but TensorFlow sees no GPU here (is tensorflow-cpu "
            f"installed?); use framework.device=auto or cpu with framework={framework}."
        )
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
    """Give TensorFlow ``wanted`` intra-op threads and one inter-op thread (0: TensorFlow's
    defaults, one thread per core it sees in each pool) and return the intra-op count it uses.

    ``framework.num_threads`` is the cores a rank computes on, as torch's ``set_num_threads`` is:
    TensorFlow's inter-op pool runs independent ops side by side, each with its own intra-op
    parallel-for, so at its default (every core) a rank asked for one thread kept two ops, two
    cores, busy on a 2-core machine (per-thread CPU seconds of the rank, ResNet-18: two
    ``tf_Compute`` threads) and each rank of a node kept every core busy. One inter-op thread
    is Intel's advice for TensorFlow on CPUs too (one per socket). ``TF_NUM_INTEROP_THREADS`` in
    the environment, when set, is the user's choice and stays.

    TensorFlow fixes both pools when its runtime starts: a rank is a fresh process, so this always
    applies there; a second run in one process (a notebook, an in-process test) keeps the first
    run's pools, and is told so instead of failing."""
    threading = tf.config.threading
    current = threading.get_intra_op_parallelism_threads()
    if not wanted:
        return current or os.cpu_count() or 1
    try:
        if wanted != current:
            threading.set_intra_op_parallelism_threads(wanted)
            current = wanted
        interop_set = os.environ.get("TF_NUM_INTEROP_THREADS", "").strip()
        if not interop_set and threading.get_inter_op_parallelism_threads() != 1:
            threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        print(
            f"ddlkit: warning: TensorFlow already started in this process with {current or 'its default'} "
            f"intra-op threads and {threading.get_inter_op_parallelism_threads() or 'its default'} inter-op "
            f"threads, and keeps them (framework.num_threads asked for {wanted} and 1); start a new process to "
            f"change them",
            file=sys.stderr,
            flush=True,
        )
    return current or os.cpu_count() or 1


def distribution_strategy(run: ddlkit.RunContext, framework: str) -> Any:
    """The seam between ddlkit's ``dist.backend`` and TensorFlow: the one place that decides
    how gradients are shared across ranks. The training code uses only the returned object's
    methods (:class:`TfDistribute`'s: ``scope()``, ``run()``, ``reduce()``,
    ``experimental_distribute_dataset()``, ``gradients_to_apply()``, ``optimizer_for_fit()``,
    ``broadcast_variables()``), so adding a backend means adding a branch here, nowhere else:

    * ``none``, or a job of one rank: ``tf.distribute.get_strategy()``, the default strategy (one
      replica, no collectives; its methods cost nothing);
    * ``native``: ``tf.distribute.MultiWorkerMirroredStrategy`` (:class:`MultiWorker`), one worker
      per rank, ``TF_CONFIG`` built from the ranks' addresses;
    * ``horovod``: Horovod's collectives (:class:`Horovod`) over the job's ranks.

    It sets ``run.device`` to the devices the strategy computes on (:func:`device_names`), and on
    GPUs ``run.device_peak_memory_mib`` to how result.json learns their peak (:func:`gpu_peak_memory`).
    """
    backend = run.cfg.dist.backend
    if backend == "none" and run.dist.world_size != 1:
        raise ddlkit.ConfigError(
            f"dist.backend=none trains in one process, but this job has "
            f"{run.dist.world_size} ranks; use dist.backend=native or horovod."
        )
    if backend not in ("none", "native", "horovod"):
        raise ddlkit.ConfigError(f"dist.backend={backend} is unknown: choose none, native or horovod.")
    import tensorflow as tf

    if backend == "native" and run.dist.world_size > 1:
        # first: the strategy configures TensorFlow's runtime, which listing the devices would start
        strategy = MultiWorker(run)
        run.device = device_names(strategy.strategy.extended.worker_devices)
        run.device_peak_memory_mib = gpu_peak_memory(run.device)
        return strategy
    replicas = Horovod(run) if run.dist.world_size > 1 else TfDistribute(tf.distribute.get_strategy())
    # without a tf.distribute strategy across ranks (one rank, or Horovod), every op runs on the
    # first GPU TensorFlow sees, else on the CPU
    run.device = device_names(tf.config.list_logical_devices("GPU")[:1] or tf.config.list_logical_devices("CPU"))
    run.device_peak_memory_mib = gpu_peak_memory(run.device)
    return replicas


def gpu_peak_memory(device: str) -> Callable[[], float] | None:
    """For ``run.device_peak_memory_mib``: a function returning the most memory TensorFlow has
    allocated on any of the GPUs in ``device`` (``run.device``'s terms: "cuda:0,cuda:1"), in MiB,
    since it started (``tf.config.experimental.get_memory_info``'s ``peak``); None where the rank
    computes on no GPU (result.json then says the process's peak resident set size)."""
    gpus = [int(name.partition(":")[2]) for name in device.split(",") if name.startswith("cuda:")]
    if not gpus:
        return None

    def peak() -> float:
        import tensorflow as tf

        # per GPU: what must fit on one device; the index is the rank's own (its logical GPUs)
        return max(tf.config.experimental.get_memory_info(f"GPU:{index}")["peak"] for index in gpus) / 2**20

    return peak


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


#: how to get a Horovod that trains TensorFlow and Keras, or what to use instead
HOROVOD_HOW_TO = (
    "Build it against the installed TensorFlow (and torch, if installed) with "
    "scripts/install_horovod.sh (Horovod 0.28.1 patched for C++17 and TensorFlow 2.21; about 9 minutes "
    "on 2 cores, then the wheel is cached), or use dist=native."
)


def check_environment(framework: str, config: DictConfig) -> None:
    """What the Python environment the ranks run in must have for ``config``
    (``Framework.check_environment``): Horovod built with TensorFlow for ``dist=horovod``."""
    if config.dist.backend == "horovod" and (problem := horovod_problem(framework)):
        raise ddlkit.ConfigError(problem)


def horovod_problem(framework: str) -> str | None:
    """Why ``dist=horovod`` cannot train ``framework`` (tensorflow or keras) in this environment,
    or None if it can."""
    built = horovod_built_with("tensorflow/mpi_lib")
    if built is None:
        return f"dist=horovod with framework={framework} needs Horovod, which is not installed. {HOROVOD_HOW_TO}"
    if not built:
        return (
            f"dist=horovod with framework={framework}: the installed Horovod was built without TensorFlow "
            f"support. {HOROVOD_HOW_TO}"
        )
    return None


class TfDistribute:
    """A ``tf.distribute`` strategy behind the seam (:func:`distribution_strategy`): variables
    created in its ``scope()`` are mirrored, and Keras' ``optimizer.apply()`` sums the replicas'
    gradients itself, in the replica context."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def scope(self) -> Any:
        return self.strategy.scope()

    def run(self, fn: Any, args: tuple = ()) -> Any:
        return self.strategy.run(fn, args=args)

    def reduce(self, op: Any, value: Any, axis: Any) -> Any:
        return self.strategy.reduce(op, value, axis=axis)

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        return self.strategy.experimental_distribute_dataset(dataset)

    def gradients_to_apply(self, grads: list[Any]) -> list[Any]:
        """Inside the replica function: what ``optimizer.apply()`` is handed, from this replica's
        gradients of its share of the global mean loss. Unchanged here: the optimizer sums them."""
        return grads

    def optimizer_for_fit(self, optimizer: Any) -> Any:
        """The optimizer for Keras' ``model.fit``, whose train step hands it each replica's
        gradients of its own mean loss. Unchanged here: the strategy scales and sums them."""
        return optimizer

    def broadcast_variables(self, variables: list[Any]) -> None:
        """Make every rank hold rank 0's values (before the first step, after a checkpoint is
        loaded). Nothing to do here: the strategy keeps its mirrored variables equal."""


class Horovod:
    """``dist=horovod`` behind the seam (:func:`distribution_strategy`): Horovod's core
    collectives, called by ddlkit's own steps, and no ``tf.distribute`` strategy (Horovod's
    Keras wrappers, ``horovod.keras`` and ``horovod.tensorflow.keras``, are Keras 2 code and break
    with Keras 3). Each rank is one replica, on its local rank's GPU or the CPU: ``scope()`` and
    ``run()`` add nothing, the dataset is this rank's own shard already, and

    * the custom loop's gradients, of this rank's share of the global mean loss (its sum over
      the global batch), are summed over the ranks in one fused all-reduce
      (:meth:`gradients_to_apply`): the gradient of the global mean, before clipping;
    * ``model.fit``'s gradients, of this rank's own mean loss, are averaged over the ranks by
      the optimizer before it applies them (:meth:`optimizer_for_fit`), so Keras' clipping and
      gradient accumulation see the global gradient;
    * rank 0's variables are broadcast once model and optimizer exist (:meth:`broadcast_variables`).

    BatchNorm's moving statistics stay per rank, as in Horovod's own examples (rank 0's are
    checkpointed).
    """

    def __init__(self, run: ddlkit.RunContext) -> None:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        if hvd.size() != run.dist.world_size:
            raise ddlkit.RunError(
                f"Horovod sees {hvd.size()} ranks but the job has {run.dist.world_size}: "
                "Horovod was started outside the job's launcher?",
                component="framework",
            )
        if gpus := tf.config.get_visible_devices("GPU"):
            if hvd.local_rank() >= len(gpus):
                raise ddlkit.ConfigError(
                    f"TensorFlow sees {len(gpus)} GPU(s) on this node, so rank {hvd.rank()} (local rank "
                    f"{hvd.local_rank()}) has none; run one rank per GPU (e.g. compute.procs_per_node=<GPUs>) or "
                    "use framework.device=cpu"
                )
            tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        self.hvd = hvd

    def scope(self) -> Any:
        return contextlib.nullcontext()

    def run(self, fn: Any, args: tuple = ()) -> Any:
        return fn(*args)

    def reduce(self, op: Any, value: Any, axis: Any) -> Any:
        """The sum over the ranks of a value each rank computed: ddlkit's steps reduce only with
        ``ReduceOp.SUM`` and ``axis=None``."""
        return self.hvd.allreduce(value, op=self.hvd.Sum)

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        return dataset

    def gradients_to_apply(self, grads: list[Any]) -> list[Any]:
        """The sum over the ranks (each rank's loss is already divided by the global batch, so
        the sum is the gradient of the global mean)."""
        return self._all_reduced(grads, self.hvd.Sum)

    def optimizer_for_fit(self, optimizer: Any) -> Any:
        """``optimizer``, turned into its own subclass whose ``apply()`` first averages the
        gradients over the ranks (Horovod's own way with a Keras optimizer: its state, config
        and checkpoint keys stay the same). Under fp16 that is the loss-scale optimizer, which
        then sees the same averaged gradients, and so the same overflows, on every rank."""
        all_reduced = self._all_reduced
        average = self.hvd.Average

        class AllReducing(type(optimizer)):  # type: ignore[misc,valid-type]
            def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
                return super().apply(all_reduced(list(grads), average), trainable_variables)

        AllReducing.__name__ = AllReducing.__qualname__ = type(optimizer).__name__
        optimizer.__class__ = AllReducing
        return optimizer

    def broadcast_variables(self, variables: list[Any]) -> None:
        import keras

        # Horovod assigns inside a tf.function, where a Keras 3 variable is a tensor: hand it
        # the tf.Variable behind each (`value`, outside any autocast scope)
        self.hvd.broadcast_variables([v.value if isinstance(v, keras.Variable) else v for v in variables], root_rank=0)

    def _all_reduced(self, grads: list[Any], op: Any) -> list[Any]:
        """``grads`` all-reduced with ``op`` in one grouped (fused) call; a variable without a
        gradient (None) keeps None."""
        present = [g for g in grads if g is not None]
        reduced = iter(self.hvd.grouped_allreduce(present, op=op) if present else [])
        return [None if g is None else next(reduced) for g in grads]


class MultiWorker(TfDistribute):
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
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": run.dist.rank}}
        )
        super().__init__(tf.distribute.MultiWorkerMirroredStrategy())

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        import tensorflow as tf

        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return self.strategy.distribute_datasets_from_function(lambda context: dataset.with_options(options))


def _all_on_this_host() -> bool:
    """Whether the rendezvous address is loopback, i.e. every rank runs on this machine."""
    host = os.environ.get("MASTER_ADDR", "")
    return host == "localhost" or host.startswith("127.") or host == "::1"
