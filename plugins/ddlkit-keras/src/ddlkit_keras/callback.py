"""The Keras callback through which ``model.fit`` reports to ddlkit's Run.

Imported only inside ``KerasFramework.train()``: it imports Keras at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

import ddlkit


class DdlkitCallback(keras.callbacks.Callback):
    """Per optimizer step (``trainer.accumulate_batches`` of fit's batches, which the optimizer
    accumulates): the scheduled learning rate before, ``run.step_end`` after (which logs,
    checkpoints, and stops ``fit`` at ``max_steps``); per epoch: validation metrics to the Run,
    which may stop ``fit`` early."""

    def __init__(self, run: ddlkit.RunContext) -> None:
        super().__init__()
        self.run = run
        self.lr = run.schedule(run.state.step)

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if batch % self.run.accumulate:
            return  # a later micro-batch of the step
        step = self.run.state.step
        self.lr = self.run.schedule(step)
        self.model.optimizer.learning_rate = self.lr  # assigns the optimizer's learning-rate variable
        if self.run.logs_at(step + 1):
            # Keras' logs["loss"] is the mean since the metrics were last reset; reset them now and
            # it is this step's loss (its micro-batches' mean), which is what the other frameworks
            # log. Only on logging steps: a reset is a handful of variable writes.
            self.model.reset_metrics()

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if (batch + 1) % self.run.accumulate:
            return  # the optimizer only accumulated this micro-batch's gradients
        # Keras has already turned the logs into Python numbers for any callback with this method
        if self.run.step_end(loss=lambda: float(logs["loss"]), lr=self.lr):
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self.end_epoch(logs or {})

    def end_epoch(self, logs: Mapping[str, Any]) -> None:
        """Report the epoch's validation; a pass cut short by ``max_steps`` is not a finished epoch."""
        # validation: the compiled loss and metrics, as Keras names them in epoch logs
        metrics = {name: float(value) for name, value in logs.items() if name.startswith("val_")}
        run = self.run
        if run.state.batch < run.steps_per_epoch:
            if metrics:
                run.validation_end(**metrics)
        elif run.epoch_end(**metrics) and self.model is not None:  # stopped early, within fit
            self.model.stop_training = True
