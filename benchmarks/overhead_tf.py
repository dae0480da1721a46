"""ddlkit's TensorFlow / Keras training throughput against hand-written code, in one process, and
the cold start of each (process start -> first training step done).

``--framework tensorflow`` compares with a plain ``tf.function`` + ``tf.GradientTape`` loop;
``--framework keras`` with a plain ``model.fit``. Both sides train the same model
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

With ``--before REF`` the benchmark also runs as it was at git REF, on that revision's code
(``_common.run_before``); the JSON gains ``before``, with ``now_over_before``: this run's CPU-time
ratio over that run's (each against its own hand-written baseline).

    python benchmarks/overhead_tf.py --framework tensorflow|keras [--model resnet18 --image-size 64
        --batch 32 --block 5 --blocks 20 --runs 2 --threads 1 --cold-starts 2] [--before REF]
"""

from __future__ import annotations

import argparse
import json
import os
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

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import make_job, run_before, run_worker, summary, write_result  # noqa: E402

import ddlkit  # noqa: E402
from ddlkit.jobdir import METRICS_FILE  # noqa: E402
from ddlkit.plugins import get_plugin_manager  # noqa: E402
from ddlkit_tensorflow.models import build_model  # noqa: E402

LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 1e-4


def synthetic(args: argparse.Namespace) -> tf.data.Dataset:
    """What ddlkit's synthetic loader serves: one batch, repeated through tf.data, prefetched."""
    g = tf.random.Generator.from_seed(0)
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
        self.opt.apply(tape.gradient(loss, self.model.trainable_variables), self.model.trainable_variables)
        return loss

    def run_block(self) -> tuple[float, float]:
        clock = Clock()
        for images, labels in self.data:
            self.opt.learning_rate = LR  # a real loop sets the scheduled lr each step too
            loss = self.train_step(images, labels)
        float(loss)  # the host read ddlkit does once per block, for logging
        return clock.read()


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
        self.model.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False,
                           metrics=[keras.metrics.SparseTopKCategoricalAccuracy(1, name="top1"),
                                    keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5")])
        self.data = synthetic(args)

    def run_block(self) -> tuple[float, float]:
        timer = BatchTimer()
        self.model.fit(self.data, verbose=0, callbacks=[timer], shuffle=False)
        return timer.seconds


BASELINES: dict[str, type] = {"tensorflow": GradientTapeLoop, "keras": PlainFit}


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
        return list(zip(self.ddlkit_s, self.baseline_s[1:]))


def overrides(args: argparse.Namespace, steps: int) -> list[str]:
    return [
        f"framework={args.framework}", f"model={args.model}", f"data.image_size={args.image_size}",
        f"data.num_classes={args.classes}", f"data.length={args.batch * steps}",
        f"trainer.batch_size={args.batch}", "trainer.epochs=1", "trainer.validate=false",
        "trainer.save_model=false", "trainer.resume=false", f"trainer.log_every={args.block}",
        f"optimizer.lr={LR}", "optimizer.scale_lr=none", "optimizer.warmup_epochs=0",
        f"optimizer.momentum={MOMENTUM}", f"optimizer.weight_decay={WEIGHT_DECAY}",
    ]


def cold_start(args: argparse.Namespace, job_dir: Path) -> float:
    """Seconds from launching ``ddlkit`` to its first training step being logged."""
    argv = [sys.executable, "-m", "ddlkit", *overrides(args, args.block), "trainer.max_steps=1",
            "trainer.log_every=1", f"hydra.run.dir={job_dir}"]
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
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--block", type=int, default=5, help="steps per timed block (ddlkit's log_every)")
    ap.add_argument("--blocks", type=int, default=20, help="blocks per ddlkit run (the first is warm-up)")
    ap.add_argument("--runs", type=int, default=2, help="ddlkit runs, each with a fresh baseline")
    ap.add_argument("--threads", type=int, default=1, help="TensorFlow intra- and inter-op threads (0: default)")
    ap.add_argument("--cold-starts", type=int, default=2)
    ap.add_argument("--before", metavar="REF", help="also run this benchmark as it was at git REF, on its code")
    args = ap.parse_args()
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    pm = get_plugin_manager()
    pairs: list[tuple[tuple[float, float], tuple[float, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):
            keras.utils.set_random_seed(r)
            probe = Interleave(BASELINES[args.framework](args))
            pm.register(probe, name="overhead-interleave")
            try:
                run_worker(make_job(Path(tmp) / f"run{r}", overrides(args, args.block * args.blocks)))
            finally:
                pm.unregister(probe)
            pairs += probe.pairs()
            print(f"run {r + 1}: CPU-time ratios per block pair "
                  f"{[round(b[1] / d[1], 3) for d, b in probe.pairs()]}", flush=True)
        colds = [cold_start(args, Path(tmp) / f"cold{i}") for i in range(args.cold_starts)]
    tf_import = tf_import_seconds()
    images = args.batch * args.block

    def ips(blocks: list[tuple[float, float]], clock: int) -> dict[str, Any]:
        return summary([images / block[clock] for block in blocks])

    ddlkit_blocks, base_blocks = [d for d, _ in pairs], [b for _, b in pairs]
    ratio = statistics.median(b[1] / d[1] for d, b in pairs)
    ratio_wall = statistics.median(b[0] / d[0] for d, b in pairs)
    # each side's least disturbed block (timeit's estimator): neighbours only ever add time
    ratio_best = min(b[1] for b in base_blocks) / min(d[1] for d in ddlkit_blocks)
    name = f"overhead_{args.framework}"
    before = {}
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "before"]
            then = run_before(args.before, "overhead_tf.py", argv, Path(tmp), result=name)
        before = {"before": {"ref": args.before, "ratio": then["ratio"], "ratio_wall": then["ratio_wall"],
                             "ddlkit_images_per_cpu_sec": then["ddlkit_images_per_cpu_sec"],
                             "now_over_before": ratio / then["ratio"]}}
    path = write_result(name, {
        "benchmark": name, "config": vars(args), "device": "cpu",
        "baseline": "tf.function + GradientTape loop" if args.framework == "tensorflow" else "model.fit",
        "ddlkit_images_per_sec": ips(ddlkit_blocks, 0), "baseline_images_per_sec": ips(base_blocks, 0),
        "ddlkit_images_per_cpu_sec": ips(ddlkit_blocks, 1), "baseline_images_per_cpu_sec": ips(base_blocks, 1),
        "ratio": ratio, "ratio_best": ratio_best, "ratio_wall": ratio_wall, "block_pairs": len(pairs), "goal": 0.98,
        "cold_start_to_first_step_s": summary(colds), "tf_import_s": tf_import, **before,
    })
    d_ips, b_ips = statistics.median(images / d[0] for d in ddlkit_blocks), statistics.median(
        images / b[0] for b in base_blocks)
    d_cpu, b_cpu = (statistics.median(images / block[1] for block in blocks) for blocks in (ddlkit_blocks, base_blocks))
    print(f"images/sec (median block): ddlkit {d_ips:.1f}, hand-written {b_ips:.1f} by wall time; ddlkit {d_cpu:.1f}, "
          f"hand-written {b_cpu:.1f} per CPU second ({args.threads or 'default'} intra-/inter-op thread(s))")
    print(f"ratio ddlkit / hand-written = {ratio:.3f} by CPU time, {ratio_wall:.3f} by wall time (medians of "
          f"{len(pairs)} block pairs), {ratio_best:.3f} by each side's best block's CPU time (goal >= 0.98)")
    print(f"cold start to first step: {statistics.median(colds):.1f} s (TensorFlow + Keras import alone "
          f"{tf_import:.1f} s) -> {path}")


if __name__ == "__main__":
    main()
