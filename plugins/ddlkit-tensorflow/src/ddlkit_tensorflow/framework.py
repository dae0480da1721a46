"""The TensorFlow training loop: a ``tf.function`` step with ``tf.GradientTape``.

TensorFlow and Keras are imported inside :meth:`TensorflowFramework.train` only, so composing
a config, ``ddlkit plugins`` and PyTorch runs never load them.
"""

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

    def train(self, run: ddlkit.RunContext) -> None:
        tf = setup_tensorflow(run, framework="tensorflow", device=self.cfg.device, num_threads=self.cfg.num_threads)
        from .data import data_errors, tf_loader
        from .training import (build_model, check_classifier, export_model, load_state, make_optimizer, save_state,
                               task)

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

    def _steps(self, tf: Any, run: ddlkit.RunContext, strategy: Any, model: Any, optimizer: Any,
               metrics: dict[str, Any]) -> tuple[Any, Any]:
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
                        images[i], labels[i], unconnected_gradients=tf.UnconnectedGradients.ZERO)
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
