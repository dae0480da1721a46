"""Keras pieces shared by ``framework=tensorflow`` (custom loop) and ``framework=keras`` (``fit``):
the optimizers Keras lacks, the loss, the checkpoint format and the final model export.

Everything here is Keras 3 (``keras.ops``), not TensorFlow, so it also serves Keras on another
backend. Imported only inside a framework's ``train()``: it imports Keras at module level.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras import ops

import ddlkit

__all__ = ["Lars", "TorchSGD", "cross_entropy", "export_model", "load_state", "make_optimizer", "save_state"]

#: key prefixes (and the meta key) inside a checkpoint file
MODEL_PREFIX = "model/"
OPTIMIZER_PREFIX = "optimizer/"
META_KEY = "meta"


@keras.saving.register_keras_serializable(package="ddlkit")
class TorchSGD(keras.optimizers.Optimizer):
    """SGD with momentum and weight decay computed exactly as ``torch.optim.SGD`` does::

        g = grad + l2 * w            # weight decay coupled into the gradient (L2), all variables
        b = momentum * b + g         # momentum buffer, kept *without* the learning rate
        w = w - lr * (g + momentum * b if nesterov else b)

    Why not ``keras.optimizers.SGD``: its velocity accumulates ``-lr * g``, so each step's
    warm-up learning rate stays baked into the velocity, while PyTorch applies the current
    rate to the whole buffer; and its ``weight_decay`` is decoupled (``w -= lr * wd * w``,
    outside momentum), which with momentum 0.9 decays about ten times less than PyTorch's
    coupled L2. ddlkit's schedule and defaults (Goyal et al.) are stated in PyTorch's terms,
    so every framework uses PyTorch's update. ``l2`` applies to every trainable variable
    (BatchNorm and biases too), as PyTorch's ``weight_decay`` does.
    """

    def __init__(
        self,
        learning_rate: float = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        l2: float = 0.0,
        name: str = "torch_sgd",
        **kwargs: Any,
    ) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if l2 < 0:
            raise ValueError(f"l2 must be >= 0, got {l2}")
        if nesterov and not momentum:
            raise ValueError("nesterov needs momentum > 0")
        self.momentum, self.nesterov, self.l2 = float(momentum), bool(nesterov), float(l2)

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        self.momentums = self.add_optimizer_variables(variables, "momentum") if self.momentum else []

    def direction(self, gradient: Any, variable: Any) -> Any:
        """The gradient momentum accumulates: here ``grad + l2 * w``."""
        # Python floats, not tensors: they take the variable's dtype (a cast would round them to
        # float32 first, which a float64 variable would notice)
        return ops.add(gradient, ops.multiply(variable, self.l2)) if self.l2 else gradient

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        lr = ops.cast(learning_rate, variable.dtype)
        g = self.direction(ops.cast(gradient, variable.dtype), variable)
        if self.momentum:
            buf = self.momentums[self._get_variable_index(variable)]
            new_buf = ops.add(ops.multiply(buf, self.momentum), g)
            self.assign(buf, new_buf)
            g = ops.add(g, ops.multiply(new_buf, self.momentum)) if self.nesterov else new_buf
        self.assign_sub(variable, ops.multiply(g, lr))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov, "l2": self.l2}


@keras.saving.register_keras_serializable(package="ddlkit")
class Lars(TorchSGD):
    """LARS (You et al., arXiv:1708.03888) with the update of ``pytorch_optimizer.LARS``, which the
    PyTorch plugin uses, so ``optimizer=lars`` trains alike in every framework. Keras has no LARS.

    For a weight matrix or kernel (more than one dimension) the direction is::

        trust = trust_coefficient * ||w|| / (||g|| + l2 * ||w||)   (1 if a norm is 0)
        g = (g + l2 * w) * trust

    while biases and BatchNorm's scales and shifts keep ``g`` (no decay, no scaling); momentum
    and the step are :class:`TorchSGD`'s.
    """

    def __init__(
        self,
        learning_rate: float = 0.1,
        momentum: float = 0.9,
        nesterov: bool = False,
        l2: float = 0.0,
        trust_coefficient: float = 0.001,
        name: str = "lars",
        **kwargs: Any,
    ) -> None:
        super().__init__(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, l2=l2, name=name, **kwargs)
        self.trust_coefficient = float(trust_coefficient)

    def direction(self, gradient: Any, variable: Any) -> Any:
        if len(variable.shape) < 2:
            return gradient
        w_norm, g_norm = ops.sqrt(ops.sum(ops.square(variable))), ops.sqrt(ops.sum(ops.square(gradient)))
        denominator = g_norm + self.l2 * w_norm
        trust = ops.where(
            ops.logical_and(w_norm > 0, denominator > 0),
            self.trust_coefficient * w_norm / ops.maximum(denominator, 1e-30),
            1.0,
        )
        return ops.multiply(ops.add(gradient, ops.multiply(variable, self.l2)), trust)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "trust_coefficient": self.trust_coefficient}


def make_optimizer(run: ddlkit.RunContext, precision: str) -> keras.optimizers.Optimizer:
    """The selected optimizer (``run.build_optimizer``); under fp16 wrapped in dynamic loss scaling."""
    opt = run.build_optimizer()
    if not isinstance(opt, keras.optimizers.Optimizer):
        raise ddlkit.PluginError(
            f"optimizer={run.cfg.optimizer.name} for framework={run.cfg.framework.name} built a "
            f"{type(opt).__name__}, not a keras.optimizers.Optimizer"
        )
    if precision == "fp16":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    return opt


def build_model(run: ddlkit.RunContext) -> keras.Model:
    """The selected model (``run.build_model``), which must be a ``keras.Model``."""
    from ddlkit.custom import model_source, wrong_kind

    model = run.build_model()
    if not isinstance(model, keras.Model):
        raise wrong_kind(model_source(run.cfg.model), model, run.cfg.framework.name, "keras.Model")
    return model


def task(run: ddlkit.RunContext) -> tuple[Callable[[Any, Any], Any], dict[str, Callable[[Any, Any], Any]]]:
    """``(loss, metrics)``, each ``fn(targets, outputs)`` in Keras' convention (one value per
    example, or the batch's mean): ``model.loss`` and ``model.metrics`` when the model names a
    loss (``model=custom``), else cross-entropy with top-1 and (over 5 classes) top-5 accuracy."""
    from ddlkit.custom import import_target

    loss = run.cfg.model.get("loss")
    if loss:
        metrics = run.cfg.model.get("metrics", {})
        return import_target(loss, "model.loss"), {
            name: import_target(path, f"model.metrics.{name}") for name, path in metrics.items()
        }
    classes = run.data.info.num_classes

    def top_k(k: int) -> Callable[[Any, Any], Any]:
        def metric(labels: Any, logits: Any) -> Any:
            return ops.cast(ops.in_top_k(ops.cast(labels, "int32"), ops.cast(logits, "float32"), k), "float32")

        return metric

    # top-5 of 5 classes or fewer is always 1: not reported
    metrics = {"top1": top_k(1), **({"top5": top_k(5)} if classes > 5 else {})}
    return cross_entropy(run.cfg.optimizer.label_smoothing), metrics


def check_classifier(run: ddlkit.RunContext, model: keras.Model, loader: Any) -> None:
    """A classifier (no ``model.loss``) must give ``(batch, data.num_classes)`` logits: checked on
    two samples before anything trains (zeros for images, else the loader's first two)."""
    from ddlkit.custom import model_source, output_mismatch

    if run.cfg.model.get("loss"):
        return
    info = run.data.info
    if info.image_size:
        probe = np.zeros((2, info.image_size, info.image_size, 3), np.float32)
    else:
        probe = next(iter(loader.iter_epoch(0))).inputs[:2]
    shape = tuple(model(probe, training=False).shape)
    if len(shape) != 2 or shape[1] != info.num_classes:
        raise output_mismatch(model_source(run.cfg.model), shape, info.num_classes)


def per_example(values: Any) -> Any:
    """A loss or metric's output as one value per example: a scalar (the batch's mean) stays a
    scalar; extra axes (a segmentation's pixels) are averaged."""
    values = ops.cast(values, "float32")
    return ops.mean(values, axis=tuple(range(1, len(values.shape)))) if len(values.shape) > 1 else values


def cross_entropy(label_smoothing: float = 0.0) -> Callable[[Any, Any], Any]:
    """Per-example cross-entropy of integer labels and logits, with PyTorch's label smoothing
    (``(1 - e) * nll + e * mean over classes of -log p``; Keras' sparse loss has no smoothing)."""

    def cross_entropy(labels: Any, logits: Any) -> Any:
        logits = ops.cast(logits, "float32")
        if not label_smoothing:
            return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        log_p = ops.log_softmax(logits, axis=-1)
        index = ops.expand_dims(ops.cast(labels, "int32"), -1)
        nll = -ops.squeeze(ops.take_along_axis(log_p, index, axis=-1), -1)
        return (1.0 - label_smoothing) * nll - label_smoothing * ops.mean(log_p, axis=-1)

    return cross_entropy


# ---------------------------------------------------------------------------------- checkpoints
def save_state(path: Path, model: keras.Model, optimizer: keras.optimizers.Optimizer, meta: dict[str, Any]) -> None:
    """Write one checkpoint *file* at ``path`` (an uncompressed ``.npz``): every model variable
    by its Keras path (``layer1.0.bn1/moving_mean``: BatchNorm statistics included), every
    optimizer variable (momentum buffers, iteration count, learning rate, loss scale) and ddlkit's
    ``meta`` as JSON. ddlkit hands a temporary path and renames the file once it is complete.

    One file rather than a directory because a file can replace a file atomically (a resumed run
    may write a step that an earlier attempt also wrote) while a directory cannot replace a
    directory. No RNG state is saved because training draws no random numbers: ResNet
    has no dropout, there is no augmentation, and the data's order is a function of (seed, epoch).
    """
    arrays = {f"{MODEL_PREFIX}{v.path}": np.asarray(v.numpy()) for v in model.weights}
    store: dict[str, np.ndarray] = {}
    optimizer.save_own_variables(store)
    arrays.update({f"{OPTIMIZER_PREFIX}{k}": np.asarray(v) for k, v in store.items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays, **{META_KEY: np.array(json.dumps(meta))})


def load_state(path: Path, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> dict[str, Any]:
    """Restore what :func:`save_state` wrote into a built ``model`` and ``optimizer``; return ``meta``."""
    with np.load(path, allow_pickle=False) as f:  # a checkpoint is data, never code to run
        arrays = {k: f[k] for k in f.files}
    weights = {k[len(MODEL_PREFIX) :]: v for k, v in arrays.items() if k.startswith(MODEL_PREFIX)}
    store = {k[len(OPTIMIZER_PREFIX) :]: v for k, v in arrays.items() if k.startswith(OPTIMIZER_PREFIX)}
    unfit = [v.path for v in model.weights if v.path not in weights or weights[v.path].shape != tuple(v.shape)]
    if unfit or len(weights) != len(model.weights):
        raise ddlkit.ConfigError(
            f"checkpoint {path} does not fit this model: {len(weights)} saved variables for its "
            f"{len(model.weights)}, {len(unfit)} missing or of another shape (e.g. {unfit[:2]}). It was written for "
            "another model or data.num_classes; use the same settings, or start fresh with trainer.resume=false."
        )
    have = len(optimizer.variables)
    if len(store) != have:
        # Keras would only warn and skip; a silently fresh momentum buffer is not a resume
        raise ddlkit.ConfigError(
            f"checkpoint {path} holds {len(store)} optimizer variables, this run's optimizer has {have}: it was "
            "written with another optimizer, trainer.precision, optimizer.momentum or (framework=keras) "
            "trainer.accumulate_batches. Use the same settings, or start fresh with trainer.resume=false."
        )
    for v in model.weights:
        v.assign(weights[v.path])
    optimizer.load_own_variables(store)
    return json.loads(str(arrays[META_KEY]))


def export_model(model: keras.Model, path: Path) -> None:
    """Save architecture + weights as ``.keras`` for scoring (``keras.models.load_model``).

    A compiled model is saved through an uncompiled copy rebuilt from its config: the training
    optimizer's state would double the file, and loading it would need ddlkit's optimizer and
    loss. (``keras.models.clone_model`` would recompile the copy.)"""
    if model.compiled:
        try:  # the model's own class: a Sequential (model=custom) is no functional Model
            copy = type(model).from_config(model.get_config())
        except (NotImplementedError, TypeError, ValueError):
            copy = None  # a subclassed model without a config: saved as it is, optimizer state included
        if copy is not None:
            for target, source in zip(copy.weights, model.weights, strict=True):
                target.assign(source)
            model = copy
    model.save(path)
