"""The TensorFlow framework, registered through the `ddlkit`
entry-point group exactly as a third-party plugin would be. It also holds the Keras 3 pieces that
[framework=keras](keras.md) shares, so each exists once.

    pip install tensorflow-cpu==2.21.0 -e ./plugins/ddlkit-tensorflow     # CPU; or -e './plugins/ddlkit-tensorflow[gpu]'
    ddlkit framework=tensorflow model=resnet50 trainer.precision=bf16

TensorFlow is not a hard dependency of the plugin (`tensorflow-cpu` and `tensorflow` are
different distributions and pip cannot tell that one satisfies the other): install the one for
the machine. The plugin's extras are `[cpu]` (`tensorflow-cpu`) and `[gpu]`
(`tensorflow[and-cuda]`).

## What it brings

- **Loop**: a custom training loop, a `tf.function` step with `tf.GradientTape`; the learning rate
  of each step comes from ddlkit's shared schedule (`run.schedule(step)`) and is assigned to the
  optimizer's learning-rate variable before the step. The host reads the loss only on logging
  steps.
- **Models** (`ddlkit_tensorflow.models`, Keras 3 functional), registered for
  `framework=tensorflow` and `framework=keras`: ResNet-18/34/50/101/152, the same networks as the
  PyTorch plugin's: ResNet v1.5 (stride on the bottleneck's 3x3 conv), no conv bias,
  torchvision's initialisers and BatchNorm settings, PyTorch's symmetric padding, layers named
  after torchvision's modules (`layer2.0.downsample.0`). Parameter counts equal torchvision's, and
  with copied weights the outputs match the PyTorch plugin's (tested).
  `keras.applications.ResNet50` is not used: it is ResNet v1 with conv biases (different
  numerics, 26,560 more trainable parameters) and has no 18/34-layer variants. Images are NHWC.
  `model=custom` takes any `keras.Model` from `model.target`.
- **Optimizers**: `optimizer=sgd|adamw|lamb|lars`. `sgd` is `TorchSGD`
  (`ddlkit_tensorflow.training`, a Keras optimizer): momentum, Nesterov and weight decay computed
  exactly as `torch.optim.SGD` does: weight decay is *coupled L2*, `wd * w` added to the gradient
  of every trainable variable (BatchNorm and biases included, as in PyTorch) before momentum, and
  the momentum buffer holds gradients, not `lr * gradient`. Keras' own `SGD` differs in both
  (decoupled `weight_decay`, about 10x weaker with momentum 0.9; the warm-up learning rate baked
  into the velocity), and ddlkit's schedule and defaults are stated in PyTorch's terms. `adamw`
  and `lamb` are Keras' own; `lars` is `ddlkit_tensorflow.training.Lars` (Keras has none)
  ([Optimizers and the learning rate](../training.md)).
- **Loss**: cross-entropy on logits with PyTorch's label smoothing (`optimizer.label_smoothing`).
- **Precision**: `trainer.precision=bf16` sets Keras' `mixed_bfloat16` policy (CPU or GPU);
  `fp16` sets `mixed_float16` with dynamic loss scaling (`keras.optimizers.LossScaleOptimizer`)
  and needs a GPU: on the CPU it is refused. The classifier computes in float32.
- **XLA**: off by default; `framework.xla=true` compiles the train and eval steps
  (`jit_compile=True`). It cannot be combined with `trainer.deterministic=true` (XLA has no
  deterministic max-pool gradient), nor with `dist=horovod`: both are refused.
- **Determinism**: `trainer.deterministic=true` calls
  `tf.config.experimental.enable_op_determinism()`; with it, a run interrupted and resumed ends
  with bit-identical weights to an uninterrupted one (tested).
- **Device and threads**: `framework.device` (`result.json`'s `device`: `cpu`, or the GPUs the
  strategy computes on in PyTorch's names, `cuda:0`); `framework.num_threads` gives a rank N
  intra-op threads and one inter-op thread, so it computes on N cores as a PyTorch rank does
  (0: TensorFlow's defaults, a thread per core in each pool; `TF_NUM_INTEROP_THREADS` in the
  environment keeps its inter-op count). TensorFlow's C++ log is off for the ranks
  (`TF_CPP_MIN_LOG_LEVEL=3` unless you set it; its errors reach Python anyway), and the notices it
  prints while it loads are dropped.
- **Input** (`ddlkit_tensorflow.data`, shared with Keras): a data source's framework-neutral
  loader becomes one whose `epoch(epoch, start_batch)` is a `tf.data.Dataset`; the loop iterates
  it directly. `data=imagefolder` decodes in `tf.data` (`ddlkit_tensorflow.imagefolder`; only the
  crop window of a JPEG is decoded), `data=synthetic` is cached by `tf.data` once, any other
  source goes through `Dataset.from_generator`. A corrupt image stops the run with ddlkit's
  one-line error (exit status 2), not TensorFlow's wrapper of it.
- **Validation** after every epoch: `val_loss`, `val_top1`, `val_top5`, reported through the run
  like every framework, so `metrics.jsonl` and `result.json` have the PyTorch plugin's fields.
- **Checkpoints** are one `.npz` file each, written atomically by ddlkit (on the training
  thread): every model variable under its Keras path (BatchNorm statistics included), every
  optimizer variable (momentum buffers, iteration count, learning rate, loss scale) and ddlkit's
  metadata. Training draws no random numbers (no dropout or augmentation; the synthetic batch is
  made once from the seed), so there is no RNG state to save. A checkpoint of another model or
  optimizer setup is refused, not half-loaded. `trainer.save_model=true` writes `model.keras`
  (architecture and weights, no training state) for scoring with `keras.models.load_model`.

## Several ranks

`dist=none` (and any job of one rank) trains with the default strategy.

`dist=native` with several ranks (`compute=local_mpi`, a cluster's mpirun, torchrun) uses
`tf.distribute.MultiWorkerMirroredStrategy`, one worker per rank: each rank picks a free port, the
ranks exchange `host:port` over ddlkit's control plane and build `TF_CONFIG` from it. Each rank
already gets its own shard in per-rank batches from ddlkit's loaders, so the strategy's own
dataset sharding and re-batching are bypassed (`distribute_datasets_from_function` with
auto-sharding off). Gradients are all-reduced (summed over losses already divided by the global
batch), so 2 ranks x batch b step like 1 rank x batch 2b (tested in `tests/test_dist.py`). On CPUs
this strategy's gRPC collectives scale worse than Horovod's
([Performance](../../explanation/performance.md#scaling-on-2-cores)).

`dist=horovod` (Horovod 0.28.1 built for TensorFlow 2.21 by `scripts/install_horovod.sh`:
[Distributed training](../distributed.md#horovod)) uses no `tf.distribute` strategy and none of
Horovod's Keras helpers, which are Keras 2 code. Each rank is one replica, on its local rank's GPU
or the CPU. The step sums the ranks' gradients (of losses already divided by the global batch)
with one `hvd.grouped_allreduce` before clipping and `optimizer.apply`. Once model and optimizer
exist (and a resumed checkpoint is loaded), `hvd.broadcast_variables` gives every rank rank 0's
weights and optimizer state. The logged loss and validation sums go through `hvd.allreduce`.
BatchNorm's moving statistics stay per rank (rank 0's are checkpointed). XLA is refused with it:
XLA would compile the all-reduce too, and this Horovod build has no XLA kernels.
`tests/test_dist.py` checks that one step of 2 Horovod ranks equals one of `dist=native` and of 1
rank with twice the batch.

## Tests

    cd plugins/ddlkit-tensorflow && python -m pytest                    # -m 'not slow' skips the CLI runs

The suite takes about two minutes on 2 CPU cores, most of it in five `ddlkit` runs (TensorFlow
takes seconds to start): one uninterrupted, one interrupted and resumed, one bf16 + XLA, one
refused config.

## How it works

TensorFlow and Keras are imported inside `TensorflowFramework.train` only (`plugin.py`,
`framework.py` and `runtime.py` import neither), so composing a config, `ddlkit plugins` and
PyTorch runs never load them. Without TensorFlow installed, selecting the framework fails with
one line naming the package. `ddlkit_tensorflow.runtime.distribution_strategy` is the one seam
between `dist.backend` and TensorFlow; the loops only call the returned object's `scope()`,
`run()`, `reduce()`, `experimental_distribute_dataset()`, `gradients_to_apply()`,
`optimizer_for_fit()` and `broadcast_variables()`. `ddlkit_tensorflow.components` registers the
models and optimizers for both frameworks.
"""  # noqa: E501 -- a command line, shown whole

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ddlkit

from .runtime import check_config, check_environment, distribution_strategy, setup_tensorflow

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass
class TensorflowConfig:
    # compile the train and evaluation steps with XLA (tf.function(jit_compile=True)): often
    # faster on GPUs, a slower first step everywhere
    xla: bool = False
    # auto (a GPU when TensorFlow sees one), cpu, or gpu
    device: str = "auto"
    # intra-op threads per rank: auto (the cores this process may use, shared by the ranks of its
    # node; see ddlkit.threads), a number, or 0 for TensorFlow's default (all cores)
    num_threads: Any = "auto"


class TensorflowFramework(ddlkit.Framework):
    model_libraries = {"keras": "a Keras model", "tensorflow": "a TensorFlow object"}
    release_image = True
    #: the trained Keras model once :meth:`train` has returned, for ``ddlkit_run_end`` hooks
    model: Any = None

    def check_environment(self, config: DictConfig) -> None:
        check_environment("tensorflow", config)

    def configure(self, config: DictConfig) -> None:
        check_config("tensorflow", self.cfg.device, self.cfg.xla, self.cfg.num_threads, config)

    def profiler(self, run: ddlkit.RunContext, out_dir: Path) -> ddlkit.Profiler:
        """``trainer.profile``: TensorFlow's profiler over the window, a trace per rank
        (:mod:`ddlkit_tensorflow.profiling`)."""
        from .profiling import TensorflowProfiler

        return TensorflowProfiler(out_dir, rank=run.dist.rank)

    def train(self, run: ddlkit.RunContext) -> None:
        tf = setup_tensorflow(run, framework="tensorflow", device=self.cfg.device, num_threads=self.cfg.num_threads)
        from .data import data_errors, tf_loader
        from .training import build_model, check_classifier, export_model, load_state, make_optimizer, save_state, task

        strategy = distribution_strategy(run, "tensorflow")
        with strategy.scope():
            model = build_model(run)
            optimizer = make_optimizer(run, run.cfg.trainer.precision)
            # slots (momentum buffers) exist before a checkpoint is loaded into them
            optimizer.build(model.trainable_variables)
        run.phase(f"model built ({model.count_params() / 1e6:.3g}M parameters)")
        loss_fn, metrics = task(run)
        metrics = {"loss": loss_fn, **metrics}
        train_step, eval_step = self._steps(tf, run, strategy, model, optimizer, metrics)

        def save(path: Path, meta: dict[str, Any]) -> None:
            save_state(path, model, optimizer, meta)

        def load(path: Path) -> dict[str, Any]:
            return load_state(path, model, optimizer)

        train, val = run.loaders()
        check_classifier(run, model, train)
        train_loader = tf_loader(train)
        val_loader = tf_loader(val) if val is not None else None
        run.phase("data ready")
        run.checkpointing(save, load)
        run.start()
        # after a resume's checkpoint too: it is the same file on every rank
        strategy.broadcast_variables([*model.weights, *optimizer.variables])

        def evaluate() -> dict[str, float]:
            sums = dict.fromkeys([*metrics, "count"], 0.0)
            for images, labels in strategy.experimental_distribute_dataset(val_loader.epoch(0)):
                for name, value in eval_step(images, labels).items():
                    sums[name] += float(value)
            total = sums.pop("count")
            return {f"val_{name}": value / total for name, value in sums.items()}

        def step(batch: Any, lr: float) -> Any:
            optimizer.learning_rate = lr  # assigns the optimizer's learning-rate variable
            loss = train_step(*batch)
            return lambda: float(loss)  # read on logging steps only (a device sync on GPUs)

        accumulate = run.accumulate

        def batches(epoch: int, start: int) -> Any:
            """From optimizer step ``start`` on: one element per step, N micro-batches stacked."""
            dataset = train_loader.epoch(epoch, start * accumulate)
            if accumulate > 1:
                dataset = dataset.batch(accumulate, drop_remainder=True)
            return strategy.experimental_distribute_dataset(dataset)

        with data_errors(train_loader, val_loader):
            run.train_epochs(batches, step, evaluate if val_loader is not None else None)
        if run.cfg.trainer.save_model:
            run.save_artifact("model.keras", lambda path: export_model(model, path))
        self.model = model

    def _steps(
        self, tf: Any, run: ddlkit.RunContext, strategy: Any, model: Any, optimizer: Any, metrics: dict[str, Any]
    ) -> tuple[Any, Any]:
        """The compiled ``train_step(images, labels) -> loss`` (one optimizer step over the
        replicas, micro-batches accumulated, gradients clipped) and ``eval_step(images, labels)
        -> {metric: sum, "count": n}``."""
        from .training import per_example

        loss_fn = metrics["loss"]
        global_batch = run.global_batch  # micro-batches included
        accumulate, clip = run.accumulate, run.cfg.trainer.clip_grad_norm

        def loss_and_gradients(images: Any, labels: Any, **tape_args: Any) -> tuple[Any, Any]:
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                # the sum over this replica's examples / the global batch: summed over replicas
                # (and micro-batches) it is the global mean, which is what the all-reduce assumes
                losses = per_example(loss_fn(labels, logits))
                if len(losses.shape):
                    loss = tf.nn.compute_average_loss(losses, global_batch_size=global_batch)
                else:  # the replica's mean: weighted by its share of the global batch
                    loss = losses * tf.cast(tf.shape(labels)[0], tf.float32) / global_batch
                scaled = optimizer.scale_loss(loss)  # identity unless fp16 loss scaling
            return loss, tape.gradient(scaled, model.trainable_variables, **tape_args)

        @tf.function(jit_compile=self.cfg.xla)
        def replica_train_step(images: Any, labels: Any) -> Any:
            if accumulate == 1:
                loss, grads = loss_and_gradients(images, labels)
            else:
                # N micro-batches stacked (see `batches`), their gradients summed in a loop that
                # holds one micro-batch's activations at a time; all-reduced once, after the loop
                loss = tf.constant(0.0)
                grads = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables]
                for i in tf.range(accumulate):
                    micro_loss, micro_grads = loss_and_gradients(
                        images[i], labels[i], unconnected_gradients=tf.UnconnectedGradients.ZERO
                    )
                    loss += micro_loss
                    grads = [g + m for g, m in zip(grads, micro_grads, strict=True)]
            # Horovod sums the ranks' gradients here (before clipping); tf.distribute's optimizer in apply()
            grads = strategy.gradients_to_apply(grads)
            if clip:
                grads = clipped_after_all_reduce(grads)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        def clipped_after_all_reduce(grads: list[Any]) -> list[Any]:
            """The gradients clipped to global norm ``clip`` as summed over the replicas. Keras'
            optimizer clips (global_clipnorm) before its all-reduce, each replica by its own norm,
            so the sum is formed here, clipped, and each replica hands on its 1/n share for the
            optimizer to sum again (one more all-reduce, only with clipping and several ranks).
            Under Horovod the gradients arrive summed, and tf.distribute sees one replica.
            Under fp16 the gradients are scaled: clipped at ``clip`` times the scale, which is
            clipping the unscaled ones at ``clip``; an overflow's inf norm gives NaN gradients,
            which the loss-scale optimizer skips."""
            context = tf.distribute.get_replica_context()
            replicas = context.num_replicas_in_sync
            if replicas > 1:
                grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            scale = getattr(optimizer, "dynamic_scale", None)
            limit = clip if scale is None else clip * tf.cast(scale, tf.float32)
            grads, _ = tf.clip_by_global_norm(grads, limit)
            return [g / replicas for g in grads] if replicas > 1 else grads

        @tf.function
        def train_step(images: Any, labels: Any) -> Any:
            losses = strategy.run(replica_train_step, args=(images, labels))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        @tf.function(jit_compile=self.cfg.xla)
        def replica_eval_step(images: Any, labels: Any) -> Any:
            outputs = model(images, training=False)
            n = tf.cast(tf.shape(labels)[0], tf.float32)
            # each metric's batch mean times the batch: sums over the validation set
            sums = {name: tf.reduce_mean(per_example(fn(labels, outputs))) * n for name, fn in metrics.items()}
            return {**sums, "count": n}

        @tf.function
        def eval_step(images: Any, labels: Any) -> Any:
            sums = strategy.run(replica_eval_step, args=(images, labels))
            return {name: strategy.reduce(tf.distribute.ReduceOp.SUM, s, axis=None) for name, s in sums.items()}

        return train_step, eval_step
