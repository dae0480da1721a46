"""The TensorFlow training loop: a ``tf.function`` step with ``tf.GradientTape``.

TensorFlow and Keras are imported inside :meth:`TensorflowFramework.train` only, so composing
a config, ``ddlkit plugins`` and PyTorch runs never load them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ddlkit

from .runtime import check_config, distribution_strategy, precision_of, setup_tensorflow

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: what ddlkit_tensorflow.models builds (plain names, so the launcher needs no TensorFlow)
MODEL_NAMES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


@dataclass
class TensorflowConfig:
    # compile the train and evaluation steps with XLA (tf.function(jit_compile=True)): often
    # faster on GPUs, a slower first step everywhere
    xla: bool = False
    # auto (a GPU when TensorFlow sees one), cpu, or gpu
    device: str = "auto"
    # intra-op threads per rank; 0 keeps TensorFlow's default (all cores)
    num_threads: int = 0


class TensorflowFramework(ddlkit.Framework):
    models = MODEL_NAMES
    #: the trained Keras model once :meth:`train` has returned, for ``ddlkit_run_end`` hooks
    model: Any = None

    def configure(self, config: DictConfig) -> None:
        check_config("tensorflow", self.cfg.device, self.cfg.xla, config)

    def train(self, run: ddlkit.Run) -> None:
        tf = setup_tensorflow(run, framework="tensorflow", device=self.cfg.device, num_threads=self.cfg.num_threads)
        from .models import build_model
        from .training import cross_entropy, export_model, load_state, make_optimizer, save_state

        t, o = run.cfg.trainer, run.cfg.optimizer
        info = run.data.info
        strategy = distribution_strategy(run, "tensorflow")
        with strategy.scope():
            model = build_model(run.cfg.model.name, info.num_classes, info.image_size,
                                zero_init_residual=run.cfg.model.zero_init_residual)
            optimizer = make_optimizer(o, run.schedule(0), precision_of(run.cfg))
            # slots (momentum buffers) exist before a checkpoint is loaded into them
            optimizer.build(model.trainable_variables)
        per_example_loss = cross_entropy(o.label_smoothing)
        global_batch, top_k = run.global_batch, min(5, info.num_classes)

        @tf.function(jit_compile=self.cfg.xla)
        def replica_train_step(images: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                # the sum over this replica's examples / the global batch: summed over replicas
                # it is the global mean, which is what the gradient all-reduce assumes
                loss = tf.nn.compute_average_loss(per_example_loss(labels, logits), global_batch_size=global_batch)
                scaled = optimizer.scale_loss(loss)  # identity unless fp16 loss scaling
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        @tf.function
        def train_step(images: Any, labels: Any) -> Any:
            losses = strategy.run(replica_train_step, args=(images, labels))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        @tf.function(jit_compile=self.cfg.xla)
        def replica_eval_step(images: Any, labels: Any) -> Any:
            logits = model(images, training=False)
            top1, top5 = (tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, k), tf.float32)) for k in (1, top_k))
            return tf.reduce_sum(per_example_loss(labels, logits)), top1, top5, tf.cast(tf.size(labels), tf.float32)

        @tf.function
        def eval_step(images: Any, labels: Any) -> Any:
            sums = strategy.run(replica_eval_step, args=(images, labels))
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, s, axis=None) for s in sums]

        def save(path: Path, meta: dict[str, Any]) -> None:
            save_state(path, model, optimizer, meta)

        def load(path: Path) -> dict[str, Any]:
            return load_state(path, model, optimizer)

        loader_args = dict(batch_size=t.batch_size, shard=run.shard, seed=t.seed)
        train_loader = run.data.loader("tensorflow", "train", **loader_args)
        val_loader = run.data.loader("tensorflow", "val", **loader_args) if t.validate else None
        run.restore(save, load)

        def evaluate() -> dict[str, float]:
            total = loss_sum = top1 = top5 = 0.0
            for images, labels in strategy.experimental_distribute_dataset(val_loader.epoch(0)):
                batch_loss, batch_top1, batch_top5, n = (float(v) for v in eval_step(images, labels))
                loss_sum, top1, top5, total = loss_sum + batch_loss, top1 + batch_top1, top5 + batch_top5, total + n
            return {"val_loss": loss_sum / total, "val_top1": top1 / total, "val_top5": top5 / total}

        def step(batch: Any, lr: float) -> Any:
            optimizer.learning_rate = lr  # assigns the optimizer's learning-rate variable
            loss = train_step(*batch)
            return lambda: float(loss)  # read on logging steps only (a device sync on GPUs)

        run.train_epochs(
            lambda epoch, start: strategy.experimental_distribute_dataset(train_loader.epoch(epoch, start)),
            step, evaluate if val_loader is not None else None)
        if t.save_model:
            run.save_artifact("model.keras", lambda path: export_model(model, path))
        self.model = model
