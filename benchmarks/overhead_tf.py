"""ddlkit's TensorFlow / Keras training throughput against hand-written code, in one process, and
the cold start of each (process start -> first training step done).

``--framework tensorflow`` compares with a plain ``tf.function`` + ``tf.GradientTape`` loop;
``--framework keras`` with a plain ``model.fit`` (results: ``overhead_tensorflow.json``,
``overhead_keras.json``). Both sides train the same model
(``ddlkit_tensorflow.models``) on the same kind of synthetic batch served by ``tf.data``, with
the same batch size, loss and threads, on the CPU. The baseline uses Keras' stock
``SGD(momentum, weight_decay)``, what hand-written code would; ddlkit uses its PyTorch-exact SGD,
so the ratio includes that choice too.

ddlkit runs its real worker code path (job file -> Run -> plugin -> loggers -> checkpoint at the
end). The measurements are interleaved finely, inside one ddlkit run: a small in-process plugin
implements ``ddlkit_step_end``, which ddlkit calls every ``--block`` steps (its logging steps);
each call closes the timing of ddlkit's last block of steps, then runs and times a block of as
many baseline steps. Neighbouring blocks see the same machine, so drift cancels in the per-pair
ratios, whose median is reported. The first block of each side (tracing) is dropped.

Shared machines: by default TensorFlow runs one intra-op and one inter-op thread (``--threads 1``;
ddlkit's run is in the same process and shares the setting). With several threads, another process
taking a core stalls every parallel op at its barrier and wall times jump by 2x at random; with one,
the process's CPU time (``time.process_time``) is the work done whatever else runs, so the headline
``ratio`` compares CPU time per block (ddlkit's overhead is CPU work: Python, logging, lr updates),
``ratio_best`` each side's fastest block by CPU time (neighbours only ever add time), and
``ratio_wall`` the wall times. On a busy 2-core machine an A/A comparison (the baseline against
itself) scatters by about +-10% per pair and +-2% in the median of a dozen pairs; a higher
priority (``nice -n -15``, as root) narrows that. On a dedicated machine use ``--threads 0``
(TensorFlow's default) and read ``ratio_wall``. Goal: ratio >= 0.98.

Cold start runs the real ``ddlkit`` command in a subprocess (``trainer.max_steps=1``) and reads
when step 1 was logged from metrics.jsonl; ``tf_import_s`` is what importing TensorFlow and Keras
alone costs in a fresh interpreter.

``--dist horovod`` (``--framework tensorflow``) measures the same against the usual Horovod TF2
loop, on 2 ranks started by ``mpirun -np 2 --oversubscribe`` (``--threads`` per rank, 1 by
default). Each rank runs ddlkit's worker path with ``dist=horovod`` (a job file composed for
``compute=local_mpi compute.procs_per_node=2``; the rank process is this script rather than
``ddlkit.rank.worker``, so the probe can be registered in it) and, interleaved the same way, the
hand-written loop: a ``tf.function`` step with ``GradientTape``, ``hvd.grouped_allreduce`` of the
gradients with ``op=hvd.Average`` (the fused all-reduce ddlkit uses; Horovod's
``DistributedGradientTape`` is Keras 2 code), the optimizer's update, and rank 0's variables
broadcast once before the first step. Each rank draws its own examples; after each run the
hand-written loop's weights must be equal on every rank (else its gradients were not shared, and
the benchmark fails). What ddlkit does beyond that is its overhead: one more all-reduce per step
(the loss, a scalar), the ranks' stop check over its control plane (``dist.stop_check_every=1``)
and, at each logging step, the mean of the loss over the ranks. Every rank switches sides at the
same steps (ddlkit's logging steps, counted, never timed), so both sides' collectives meet in the
same order on both ranks. Each rank times its own blocks; the ratios are medians over every rank's block pairs
(``per_rank`` has each rank's). A rank's CPU time includes Horovod's background thread, which
also runs while the rank waits for the other at an all-reduce. No cold start is measured.
Result: ``overhead_tensorflow_horovod.json``.

With ``--before REF`` the benchmark also runs as it was at git REF, on that revision's code
(``_common.run_before``); the JSON gains ``before``, with ``now_over_before``: this run's CPU-time
ratio over that run's (each against its own hand-written baseline).

    python benchmarks/overhead_tf.py --framework tensorflow|keras [--model resnet18 --image-size 64
        --batch 32 --block 5 --blocks 20 --runs 2 --threads 1 --cold-starts 2] [--before REF]
    python benchmarks/overhead_tf.py --framework tensorflow --dist horovod [same options]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

# TensorFlow's C++ INFO lines would bury the numbers (the plugin sets the same default); this
# must happen before TensorFlow is imported
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import keras
import tensorflow as tf
from _common import make_job, one_thread_env, run_before, run_worker, summary, write_result

import ddlkit
from ddlkit.jobdir import METRICS_FILE
from ddlkit.plugins import get_plugin_manager
from ddlkit_tensorflow.models import build_model
from ddlkit_tensorflow.runtime import horovod_problem

LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 1e-4
#: ranks of ``--dist horovod``
RANKS = 2


def synthetic(args: argparse.Namespace, seed: int = 0) -> tf.data.Dataset:
    """What ddlkit's synthetic loader serves: one batch, repeated through tf.data, prefetched."""
    g = tf.random.Generator.from_seed(seed)
    images = g.normal((args.batch, args.image_size, args.image_size, 3))
    labels = g.uniform((args.batch,), 0, args.classes, dtype=tf.int64)
    return tf.data.Dataset.from_tensors((images, labels)).repeat(args.block).prefetch(tf.data.AUTOTUNE)


class Clock:
    """Wall and CPU seconds since construction."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


class Baseline(Protocol):
    def run_block(self) -> tuple[float, float]:
        """Train ``--block`` steps; return the (wall, CPU) seconds they took."""


class GradientTapeLoop:
    """The custom loop a user would write by hand."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model = build_model(args.model, args.classes, args.image_size)
        self.opt = keras.optimizers.SGD(LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.data = synthetic(args)
        self.train_step = tf.function(self._step)

    def _step(self, images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = self.loss_fn(labels, self.model(images, training=True))
        grads = self.shared(tape.gradient(loss, self.model.trainable_variables))
        self.opt.apply(grads, self.model.trainable_variables)
        return loss

    def shared(self, grads: list[Any]) -> list[Any]:
        """The gradients the optimizer applies: this process's own (one process, nothing to share)."""
        return grads

    def run_block(self) -> tuple[float, float]:
        clock = Clock()
        for images, labels in self.data:
            self.opt.learning_rate = LR  # a real loop sets the scheduled lr each step too
            loss = self.train_step(images, labels)
        float(loss)  # the host read ddlkit does once per block, for logging
        return clock.read()


class HorovodLoop(GradientTapeLoop):
    """The usual Horovod TF2 loop, with Horovod's core collectives: every rank's gradients averaged
    in one fused all-reduce before the update, rank 0's variables broadcast once before the first step."""

    def __init__(self, args: argparse.Namespace) -> None:
        import horovod.tensorflow as hvd

        hvd.init()
        super().__init__(args)
        self.hvd = hvd
        self.data = synthetic(args, seed=hvd.rank())  # each rank its own examples, as ddlkit's ranks
        self.opt.build(self.model.trainable_variables)  # its slots exist, to be broadcast
        # Horovod assigns inside a tf.function, where a Keras 3 variable is a tensor: the
        # tf.Variable behind each is what it is handed
        hvd.broadcast_variables([v.value for v in [*self.model.variables, *self.opt.variables]], root_rank=0)

    def shared(self, grads: list[Any]) -> list[Any]:
        return self.hvd.grouped_allreduce(grads, op=self.hvd.Average)

    def check_in_sync(self) -> None:
        """Fail unless every rank holds the same weights: the ranks see different examples, so
        only a loop whose updates really are shared keeps them equal."""
        total = tf.add_n([tf.reduce_sum(tf.cast(v.value, tf.float64)) for v in self.model.trainable_variables])
        sums = self.hvd.allgather(tf.reshape(total, [1])).numpy()
        if not all(abs(x - sums[0]) <= 1e-9 * max(1.0, abs(sums[0])) for x in sums):
            raise RuntimeError(
                f"the hand-written Horovod loop's ranks hold different weights (sums "
                f"{[float(x) for x in sums]}): its gradients were not averaged over the ranks"
            )


class BatchTimer(keras.callbacks.Callback):
    """From the first batch's start to the epoch's end. Implements no ``on_*_batch_end``, which
    would make Keras convert every batch's logs to Python numbers and change what is measured."""

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if batch == 0:
            self.clock = Clock()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.seconds = self.clock.read()


class PlainFit:
    """A plain ``model.fit`` per block, timed from its first batch to its end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model = build_model(args.model, args.classes, args.image_size)
        self.model.compile(
            optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
            metrics=[
                keras.metrics.SparseTopKCategoricalAccuracy(1, name="top1"),
                keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5"),
            ],
        )
        self.data = synthetic(args)

    def run_block(self) -> tuple[float, float]:
        timer = BatchTimer()
        self.model.fit(self.data, verbose=0, callbacks=[timer], shuffle=False)
        return timer.seconds


BASELINES: dict[str, type] = {"tensorflow": GradientTapeLoop, "keras": PlainFit}
#: --dist -> what the baseline is, in the JSON
BASELINE_NAMES = {
    ("tensorflow", "none"): "tf.function + GradientTape loop",
    ("keras", "none"): "model.fit",
    ("tensorflow", "horovod"): "tf.function + GradientTape loop, hvd.grouped_allreduce(op=hvd.Average) "
    "of the gradients, hvd.broadcast_variables once",
}


class Interleave:
    """An in-process ddlkit plugin: at each of ddlkit's logging steps, close the timing of the
    ddlkit block that just ended, run one baseline block, and start timing ddlkit again."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline
        #: (wall, CPU) seconds per block
        self.ddlkit_s: list[tuple[float, float]] = []
        self.baseline_s: list[tuple[float, float]] = []
        self._clock: Clock | None = None

    @ddlkit.hookimpl
    def ddlkit_step_end(self, run: ddlkit.Run, step: int, metrics: dict[str, float]) -> None:
        if self._clock is not None:  # the first block (steps 1..block) traces: not recorded
            self.ddlkit_s.append(self._clock.read())
        self.baseline_s.append(self.baseline.run_block())
        self._clock = Clock()

    def pairs(self) -> list[tuple[tuple[float, float], tuple[float, float]]]:
        """Each ddlkit block with the baseline block that ran just after it (baseline block 0,
        which traces, is dropped)."""
        return list(zip(self.ddlkit_s, self.baseline_s[1:], strict=True))


def overrides(args: argparse.Namespace, steps: int) -> list[str]:
    """The job: ``steps`` steps of ``--batch`` images per rank, a logging step (a block's end) every ``--block``."""
    ranks = RANKS if args.dist == "horovod" else 1
    # a real 2-rank Horovod job's file (the ranks are started here, by mpirun, as local_mpi would)
    distributed = ["dist=horovod", "compute=local_mpi", f"compute.procs_per_node={RANKS}"] if ranks > 1 else []
    return [
        f"framework={args.framework}",
        f"model={args.model}",
        f"data.image_size={args.image_size}",
        f"data.num_classes={args.classes}",
        f"data.length={args.batch * ranks * steps}",
        f"trainer.batch_size={args.batch}",
        "trainer.epochs=1",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.resume=false",
        f"trainer.log_every={args.block}",
        f"optimizer.lr={LR}",
        "optimizer.scale_lr=none",
        "optimizer.warmup_epochs=0",
        f"optimizer.momentum={MOMENTUM}",
        f"optimizer.weight_decay={WEIGHT_DECAY}",
        *distributed,
    ]


Pair = tuple[tuple[float, float], tuple[float, float]]


def interleaved_run(args: argparse.Namespace, job_file: Path, seed: int, say: bool = True) -> list[Pair]:
    """Run ddlkit's worker on ``job_file`` in this process with a fresh baseline interleaved;
    return the (ddlkit, baseline) block pairs, each block's (wall, CPU) seconds."""
    pm = get_plugin_manager()
    keras.utils.set_random_seed(seed)
    probe = Interleave((HorovodLoop if args.dist == "horovod" else BASELINES[args.framework])(args))
    pm.register(probe, name="overhead-interleave")
    try:
        run_worker(job_file)
    finally:
        pm.unregister(probe)
    if isinstance(probe.baseline, HorovodLoop):
        probe.baseline.check_in_sync()
    if say:
        print(
            f"run {seed + 1}: CPU-time ratios per block pair {[round(b[1] / d[1], 3) for d, b in probe.pairs()]}",
            flush=True,
        )
    return probe.pairs()


#: in ``--rank-dir``: the job files and control-plane ports of the runs, and each rank's pairs
RANK_PLAN, RANK_PAIRS = "runs.json", "rank-{}.json"


def run_ranks(args: argparse.Namespace, job_files: list[Path], work: Path) -> list[list[Pair]]:
    """``--dist horovod``: start :data:`RANKS` ranks of this script under mpirun, each running
    every job in turn (:func:`rank_main`); return each rank's block pairs."""
    from ddlkit_mpi.target import free_ports

    if shutil.which("mpirun") is None:
        sys.exit("overhead_tf.py --dist horovod needs OpenMPI's mpirun: apt-get install openmpi-bin")
    if problem := horovod_problem("tensorflow"):
        sys.exit(f"overhead_tf.py --dist horovod: {problem}")
    # each run's rank 0 listens on a port of its own: no rank can reach the previous run's
    plan = {"jobs": [str(j) for j in job_files], "control_ports": free_ports(len(job_files))}
    (work / RANK_PLAN).write_text(json.dumps(plan))
    env = {
        **(one_thread_env() if args.threads == 1 else os.environ),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    argv = [
        "mpirun",
        "-np",
        str(RANKS),
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        __file__,
        *script_argv(args),
        f"--rank-dir={work}",
    ]
    code = subprocess.run(argv, env=env, timeout=3600).returncode  # rank 0's output shows as it goes
    if code != 0:
        raise RuntimeError(f"the {RANKS} ranks failed (mpirun exited {code}); their errors are above")
    return [
        [(tuple(d), tuple(b)) for d, b in json.loads((work / RANK_PAIRS.format(r)).read_text())] for r in range(RANKS)
    ]


def rank_main(args: argparse.Namespace) -> None:
    """One rank of ``--dist horovod``: every job of the plan in turn, then this rank's pairs."""
    import horovod.tensorflow as hvd

    hvd.init()
    work = Path(args.rank_dir)
    plan = json.loads((work / RANK_PLAN).read_text())
    pairs: list[Pair] = []
    for r, (job, port) in enumerate(zip(plan["jobs"], plan["control_ports"], strict=True)):
        # what compute=local_mpi tells its ranks: where rank 0's control plane listens
        os.environ["DDLKIT_CONTROL_ADDR"] = f"127.0.0.1:{port}"
        pairs += interleaved_run(args, Path(job), seed=r, say=hvd.rank() == 0)
    (work / RANK_PAIRS.format(hvd.rank())).write_text(json.dumps(pairs))


def script_argv(args: argparse.Namespace) -> list[str]:
    """This run's options as arguments of this script (``--dist`` only when not the default,
    which revisions from before it do not know)."""
    skip = {"before", "rank_dir"} | ({"dist"} if args.dist == "none" else set())
    return [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in skip and v is not None]


def cold_start(args: argparse.Namespace, job_dir: Path) -> float:
    """Seconds from launching ``ddlkit`` to its first training step being logged."""
    argv = [
        sys.executable,
        "-m",
        "ddlkit",
        *overrides(args, args.block),
        "trainer.max_steps=1",
        "trainer.log_every=1",
        f"hydra.run.dir={job_dir}",
    ]
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"cold-start run failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    first = json.loads((job_dir / METRICS_FILE).read_text().splitlines()[0])
    return first["time"] - start


def tf_import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import tensorflow, keras; print(time.perf_counter() - t)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=sorted(BASELINES), required=True)
    ap.add_argument(
        "--dist",
        choices=("none", "horovod"),
        default="none",
        help=f"horovod: {RANKS} ranks under mpirun, ddlkit's dist=horovod against a hand-written hvd loop",
    )
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="images per rank per step")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--block", type=int, default=5, help="steps per timed block (ddlkit's log_every)")
    ap.add_argument("--blocks", type=int, default=20, help="blocks per ddlkit run (the first is warm-up)")
    ap.add_argument("--runs", type=int, default=2, help="ddlkit runs, each with a fresh baseline")
    ap.add_argument(
        "--threads", type=int, default=1, help="TensorFlow intra- and inter-op threads, per rank (0: default)"
    )
    ap.add_argument("--cold-starts", type=int, default=2, help="single-process only")
    ap.add_argument("--before", metavar="REF", help="also run this benchmark as it was at git REF, on its code")
    ap.add_argument("--rank-dir", help=argparse.SUPPRESS)  # set for the ranks that --dist horovod starts
    args = ap.parse_args()
    if args.dist == "horovod" and args.framework != "tensorflow":
        ap.error(
            "--dist horovod measures framework=tensorflow's custom loop: use --framework tensorflow "
            "(Horovod's Keras wrappers, a hand-written fit's counterpart, break with Keras 3)"
        )
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.rank_dir:
        rank_main(args)
        return

    horovod = args.dist == "horovod"
    colds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        # ddlkit's threads: what this process set already, which TensorFlow keeps (another count
        # would only be warned about)
        interleaved = [*overrides(args, args.block * args.blocks), f"framework.num_threads={args.threads}"]
        jobs = [make_job(Path(tmp) / f"run{r}", interleaved) for r in range(args.runs)]
        if horovod:
            per_rank = run_ranks(args, jobs, Path(tmp))
        else:
            per_rank = [[pair for r, job in enumerate(jobs) for pair in interleaved_run(args, job, seed=r)]]
            colds = [cold_start(args, Path(tmp) / f"cold{i}") for i in range(args.cold_starts)]
    pairs = [pair for rank in per_rank for pair in rank]
    images = args.batch * args.block  # per rank

    def ips(blocks: list[tuple[float, float]], clock: int) -> dict[str, Any]:
        return summary([images / block[clock] for block in blocks])

    def ratios(pairs: list[Pair]) -> dict[str, float]:
        return {
            "ratio": statistics.median(b[1] / d[1] for d, b in pairs),
            # each side's least disturbed block (timeit's estimator): neighbours only ever add time
            "ratio_best": min(b[1] for _, b in pairs) / min(d[1] for d, _ in pairs),
            "ratio_wall": statistics.median(b[0] / d[0] for d, b in pairs),
        }

    ddlkit_blocks, base_blocks = [d for d, _ in pairs], [b for _, b in pairs]
    overall = ratios(pairs)
    ratio, ratio_wall, ratio_best = overall["ratio"], overall["ratio_wall"], overall["ratio_best"]
    name = f"overhead_{args.framework}" + ("_horovod" if horovod else "")
    before = {}
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            then = run_before(args.before, "overhead_tf.py", script_argv(args), Path(tmp), result=name)
        before = {
            "before": {
                "ref": args.before,
                "ratio": then["ratio"],
                "ratio_wall": then["ratio_wall"],
                "ddlkit_images_per_cpu_sec": then["ddlkit_images_per_cpu_sec"],
                "now_over_before": ratio / then["ratio"],
            }
        }
    if horovod:
        where: dict[str, Any] = {
            "ranks": RANKS,
            "images_per_sec_of": "one rank",
            "per_rank": [{**ratios(rank), "block_pairs": len(rank)} for rank in per_rank],
        }
    else:
        tf_import = tf_import_seconds()
        where = {"cold_start_to_first_step_s": summary(colds), "tf_import_s": tf_import}
    path = write_result(
        name,
        {
            "benchmark": name,
            "config": {k: v for k, v in vars(args).items() if k != "rank_dir"},
            "device": "cpu",
            "baseline": BASELINE_NAMES[args.framework, args.dist],
            "ddlkit_images_per_sec": ips(ddlkit_blocks, 0),
            "baseline_images_per_sec": ips(base_blocks, 0),
            "ddlkit_images_per_cpu_sec": ips(ddlkit_blocks, 1),
            "baseline_images_per_cpu_sec": ips(base_blocks, 1),
            "ratio": ratio,
            "ratio_best": ratio_best,
            "ratio_wall": ratio_wall,
            "block_pairs": len(pairs),
            "goal": 0.98,
            **where,
            **before,
        },
    )
    d_ips, b_ips = (
        statistics.median(images / d[0] for d in ddlkit_blocks),
        statistics.median(images / b[0] for b in base_blocks),
    )
    d_cpu, b_cpu = (statistics.median(images / block[1] for block in blocks) for blocks in (ddlkit_blocks, base_blocks))
    per = f" per rank ({RANKS} Horovod ranks)" if horovod else ""
    print(
        f"images/sec{per} (median block): ddlkit {d_ips:.1f}, hand-written {b_ips:.1f} by wall time; ddlkit "
        f"{d_cpu:.1f}, hand-written {b_cpu:.1f} per CPU second ({args.threads or 'default'} intra-/inter-op "
        f"thread(s))"
    )
    print(
        f"ratio ddlkit / hand-written = {ratio:.3f} by CPU time, {ratio_wall:.3f} by wall time (medians of "
        f"{len(pairs)} block pairs{' of all ranks' if horovod else ''}), {ratio_best:.3f} by each side's best "
        f"block's CPU time (goal >= 0.98)"
    )
    if horovod:
        for r, rank in enumerate(where["per_rank"]):
            print(f"  rank {r}: {rank['ratio']:.3f} by CPU time, {rank['ratio_wall']:.3f} by wall time")
        print(f"-> {path}")
    else:
        print(
            f"cold start to first step: {statistics.median(colds):.1f} s (TensorFlow + Keras import alone "
            f"{tf_import:.1f} s) -> {path}"
        )


if __name__ == "__main__":
    main()
