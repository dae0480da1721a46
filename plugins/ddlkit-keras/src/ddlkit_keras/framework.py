"""The Keras 3 framework: training with `model.fit`, ddlkit's
per-step work done in a `keras.callbacks.Callback`. The models, optimizers (each registered for
`framework=keras` too), input pipelines, loss, checkpoint format and runtime setup are those of
[framework=tensorflow](tensorflow.md) (imported from its plugin, not copied): ResNet-18..152
identical to the PyTorch plugin's networks, SGD with PyTorch's semantics, bf16/fp16 mixed
precision, `framework.xla`, `framework.device`, `framework.num_threads`,
`trainer.deterministic`.

    pip install tensorflow-cpu==2.21.0 -e ./plugins/ddlkit-tensorflow -e ./plugins/ddlkit-keras
    ddlkit framework=keras model=resnet50 trainer.precision=bf16

## The callback

`ddlkit_keras.callback.DdlkitCallback`: before each batch it sets the learning rate from
`run.schedule(step)` on the optimizer; after each batch it calls `run.step_end`, which logs,
checkpoints and returns True at `trainer.max_steps`, upon which the callback sets
`model.stop_training`; after each epoch it reports `val_loss`, `val_top1`, `val_top5` (Keras'
validation of the compiled loss and top-k metrics) through `run.epoch_end`.

Keras' `logs["loss"]` is a running mean since its metrics were last reset. Before a logging step
the callback resets them, so the logged loss is that batch's own loss, as every other framework
logs it; other steps cost no extra work (Keras itself turns each batch's logs into Python numbers
for any callback that has `on_train_batch_end`).

## Resume

Resumed runs end with bit-identical weights to uninterrupted ones under
`trainer.deterministic=true` (tested, mid-epoch and just after an epoch's last step). A
checkpoint taken after an epoch's last step but before its validation (a SIGTERM there) resumes by
validating that epoch, then goes on. The final model is `model.keras` (architecture and weights,
no optimizer state), loadable with `keras.models.load_model` without ddlkit.

## Backends

`framework.backend=tensorflow` (the default) is the only backend. Keras reads `KERAS_BACKEND`
once, at its first import, and the plugin sets it in the worker before importing Keras, so the
mechanism is there; `torch` is refused in the launcher because it is not cheap to support
properly: the shared ResNets name their layers after torchvision's modules (`layer1.0.conv1`),
which Keras' torch backend rejects as PyTorch parameter names; device choice, fp16 checks,
threads and determinism are set up through TensorFlow; and the `tf.data` input would be copied to
torch tensors every step. For PyTorch, use [framework=pytorch](pytorch.md).

## Several ranks

`framework=keras` trains several ranks with `dist=horovod`: `model.fit` as on one rank, with the
optimizer turned into a subclass of itself whose `apply()` first averages the gradients
`model.fit` hands it (of each rank's mean loss, with `hvd.grouped_allreduce`), so Keras' gradient
accumulation, clipping and update see the global gradient; rank 0's weights and optimizer state
are broadcast before the first step. It needs Horovod built for TensorFlow by
`scripts/install_horovod.sh` ([Distributed training](../distributed.md#horovod)).
`tests/test_dist.py` checks that one step of 2 ranks equals one of 1 rank with twice the batch
and one of `framework=tensorflow dist=native`.

`dist=native` is refused before the job starts: Keras 3's `model.fit` fails under
`tf.distribute.MultiWorkerMirroredStrategy`, first in its symbolic build (it all-reduces the
first input batch as one value), then in its per-replica reduction of the step's logs
([keras-team/keras#20585](https://github.com/keras-team/keras/issues/20585),
[tensorflow/tensorflow#72388](https://github.com/tensorflow/tensorflow/issues/72388); checked with
Keras 3.15 / TensorFlow 2.21). Use `dist=horovod`, or `framework=tensorflow dist=native`: the same
ResNets, optimizer and checkpoint format, in a custom loop.

## Tests

    cd plugins/ddlkit-keras && python -m pytest                         # -m 'not slow' skips the CLI runs

The suite takes about a minute and a half on 2 CPU cores, most of it in four `ddlkit` runs: one
uninterrupted, one interrupted mid-epoch and resumed, one resumed from just after an epoch's last
step. Where Horovod is built for TensorFlow, `tests/test_dist.py` adds three runs (about 45 s).

## How it works

Keras and TensorFlow are imported inside `KerasFramework.train` only, so composing a config,
`ddlkit plugins` and PyTorch runs never load them.

Resuming mid-epoch: `fit` runs whole passes over one dataset, so a run resumed after batch `k` of
epoch `e` first fits epoch `e` alone on the loader's `epoch(e, k)` dataset
(`initial_epoch=e, epochs=e + 1`: only the batches not yet seen), then fits the remaining epochs
on the full dataset with `initial_epoch=e + 1`. Keras keeps the compiled train function between
the two calls, so nothing is traced twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ddlkit

# without ddlkit-tensorflow, the plugin module (plugin.py) fails to load and says what to install
from ddlkit_tensorflow.framework import TensorflowConfig
from ddlkit_tensorflow.runtime import check_config, check_environment, distribution_strategy, setup_tensorflow

if TYPE_CHECKING:
    from pathlib import Path

    from omegaconf import DictConfig

#: framework.backend values this plugin trains with
BACKENDS = ("tensorflow",)


@dataclass
class KerasConfig(TensorflowConfig):
    # Keras backend; only tensorflow so far (the framework=keras page says why not torch or jax yet)
    backend: str = "tensorflow"


class KerasFramework(ddlkit.Framework):
    model_libraries = {"keras": "a Keras model", "tensorflow": "a TensorFlow object"}
    release_image = True
    #: the trained Keras model once :meth:`train` has returned, for ``ddlkit_run_end`` hooks
    model: Any = None

    def check_environment(self, config: DictConfig) -> None:
        check_environment("keras", config)

    def configure(self, config: DictConfig) -> None:
        if self.cfg.backend not in BACKENDS:
            raise ddlkit.ConfigError(
                f"framework.backend={self.cfg.backend} is not supported: framework=keras trains with "
                f"{', '.join(BACKENDS)} (for PyTorch use framework=pytorch)."
            )
        check_config("keras", self.cfg.device, self.cfg.xla, self.cfg.num_threads, config)
        if config.dist.backend == "native":
            raise ddlkit.ConfigError(
                "framework=keras cannot train with dist=native: Keras 3's model.fit fails under "
                "tf.distribute.MultiWorkerMirroredStrategy (keras-team/keras#20585, tensorflow/tensorflow#72388). "
                "For several ranks use dist=horovod, or framework=tensorflow (the same ResNets, optimizer and "
                "checkpoints, in a custom loop) with dist=native."
            )
        if config.trainer.accumulate_batches > 1 and config.trainer.precision == "fp16":
            raise ddlkit.ConfigError(
                "framework=keras cannot accumulate gradients under trainer.precision=fp16: Keras' loss-scale "
                "optimizer skips an overflowing micro-batch without counting it, which shifts its accumulation "
                "out of step with the optimizer steps. Use framework=tensorflow, or trainer.precision=bf16."
            )

    def profiler(self, run: ddlkit.RunContext, out_dir: Path) -> ddlkit.Profiler:
        """``trainer.profile``: TensorFlow's profiler over the window, a trace per rank
        (:mod:`ddlkit_tensorflow.profiling`); the window follows the optimizer steps fit's callback reports."""
        from ddlkit_tensorflow.profiling import TensorflowProfiler

        return TensorflowProfiler(out_dir, rank=run.dist.rank)

    def train(self, run: ddlkit.RunContext) -> None:
        # Keras reads its backend once, at its first import in this process
        os.environ["KERAS_BACKEND"] = self.cfg.backend
        setup_tensorflow(run, framework="keras", device=self.cfg.device, num_threads=self.cfg.num_threads)
        import keras

        if keras.backend.backend() != self.cfg.backend:
            raise ddlkit.ConfigError(
                f"Keras was already imported in this process with backend "
                f"{keras.backend.backend()}; framework.backend={self.cfg.backend} cannot apply."
            )
        from ddlkit_tensorflow.data import data_errors, tf_loader
        from ddlkit_tensorflow.training import (
            build_model,
            check_classifier,
            export_model,
            load_state,
            make_optimizer,
            save_state,
            task,
        )

        from .callback import DdlkitCallback

        t = run.cfg.trainer
        strategy = distribution_strategy(run, "keras")
        with strategy.scope():
            model = build_model(run)
            # under Horovod, an optimizer that averages the ranks' gradients before anything else
            optimizer = strategy.optimizer_for_fit(make_optimizer(run, run.cfg.trainer.precision))
            # Keras' own clipping and accumulation: the loss-scale optimizer hands its inner one
            # unscaled gradients, which that accumulates, averages, clips, then applies; no
            # all-reduce comes after the clipping (tf.distribute's would: see configure)
            inner = getattr(optimizer, "inner_optimizer", optimizer)
            if t.clip_grad_norm:
                inner.global_clipnorm = float(t.clip_grad_norm)
            if run.accumulate > 1:
                inner.gradient_accumulation_steps = run.accumulate  # read when it is built, below
            loss, metrics = task(run)
            model.compile(
                optimizer=optimizer,
                loss=loss,
                jit_compile=self.cfg.xla,
                metrics=[keras.metrics.MeanMetricWrapper(fn, name=name) for name, fn in metrics.items()],
            )
            # slots (momentum buffers) exist before a checkpoint is loaded into them
            optimizer.build(model.trainable_variables)
        run.phase(f"model built ({model.count_params() / 1e6:.3g}M parameters)")

        def save(path: Path, meta: dict[str, Any]) -> None:
            save_state(path, model, optimizer, meta)

        def load(path: Path) -> dict[str, Any]:
            return load_state(path, model, optimizer)

        train, val = run.loaders()
        check_classifier(run, model, train)
        # fit iterates `dataset` once per epoch: each pass serves the run's current one
        train_loader = tf_loader(train, pass_epoch=lambda: run.state.epoch)
        val_loader = tf_loader(val) if val is not None else None
        val_data = val_loader.dataset if val_loader is not None else None
        run.phase("data ready")
        run.checkpointing(save, load)
        run.start()
        # after a resume's checkpoint too: it is the same file on every rank
        strategy.broadcast_variables([*model.weights, *optimizer.variables])
        with data_errors(train_loader, val_loader):
            self._fit(run, model, train_loader, val_data, DdlkitCallback(run))
        if t.save_model:
            run.save_artifact("model.keras", lambda path: export_model(model, path))
        self.model = model

    @staticmethod
    def _fit(run: ddlkit.RunContext, model: Any, train_loader: Any, val_data: Any, callback: Any) -> None:
        """Fit from where the run stands to the end (see the module docstring for a mid-epoch resume)."""
        t = run.cfg.trainer
        n = run.accumulate

        def steps(dataset: Any, count: int) -> Any:
            """``count`` optimizer steps of micro-batches (a pass leaves out those that make no full step)."""
            return dataset.take(count * n) if n > 1 else dataset

        epoch, done = run.state.epoch, run.state.batch
        if done and not run.finished:
            if done < run.steps_per_epoch:
                model.fit(
                    steps(train_loader.epoch(epoch, done * n), run.steps_per_epoch - done),
                    initial_epoch=epoch,
                    epochs=epoch + 1,
                    validation_data=val_data,
                    callbacks=[callback],
                    shuffle=False,
                    verbose=0,
                )
            else:
                # stopped after the epoch's last step, before its validation: only that is left
                logs = model.evaluate(val_data, return_dict=True, verbose=0) if val_data is not None else {}
                callback.end_epoch({f"val_{name}": value for name, value in logs.items()})
        if not run.finished and run.state.epoch < t.epochs:
            # shuffle=False: a tf.data pipeline orders itself (Keras would only warn that it cannot)
            model.fit(
                steps(train_loader.dataset, run.steps_per_epoch),
                initial_epoch=run.state.epoch,
                epochs=t.epochs,
                validation_data=val_data,
                callbacks=[callback],
                shuffle=False,
                verbose=0,
            )
