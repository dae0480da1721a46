"""The epoch loop every framework shares, from where ``run.checkpointing`` left off to the end.

It drives the run only through the calls a framework with a loop of its own makes too
(``step_end``, ``validation_end``, ``epoch_end``), so the two kinds of framework keep the same
rules: when to log, checkpoint, validate and stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..interfaces import RunContext


#: the end of an epoch's batches
_END = object()


def step_batches(
    micro_batches: Callable[[int, int], Iterable[Any]], accumulate: int
) -> Callable[[int, int], Iterable[list]]:
    """A loader's ``iter_epoch(epoch, start_batch)`` as :func:`train_epochs` wants ``batches``:
    from optimizer step ``start`` on, one list of ``accumulate`` (``trainer.accumulate_batches``)
    micro-batches per optimizer step (an epoch's last micro-batches that make no full step are
    left out)."""

    def batches(epoch: int, start: int) -> Iterator[list]:
        group: list = []
        for batch in micro_batches(epoch, start * accumulate):
            group.append(batch)
            if len(group) == accumulate:
                yield group
                group = []

    return batches


def train_epochs(
    run: RunContext,
    batches: Callable[[int, int], Iterable[Any]],
    step: Callable[[Any, float], Callable[[], float] | float],
    evaluate: Callable[[], Mapping[str, float]] | None = None,
) -> None:
    """Train ``run`` to its end; the framework brings what differs:

    * ``batches(epoch, start)``: that epoch's data from optimizer step ``start`` on, one item
      per optimizer step (a run resumed mid-epoch sees only the batches it had not seen). With
      ``trainer.accumulate_batches=N`` an item holds N micro-batches: :func:`step_batches` groups
      a loader's batches so, or the framework groups them in its own pipeline;
    * ``step(batch, lr)``: one optimizer step at learning rate ``lr`` (gradients of the item's
      micro-batches averaged, all-reduced once, clipped to ``trainer.clip_grad_norm``),
      returning the loss, or a function that reads it (called only on logging steps: on a GPU
      reading is a sync);
    * ``evaluate()``: validation metrics (``val_loss``, ``val_top1``, ``val_top5``); None
      when ``trainer.validate`` is off.

    Each full epoch is validated, then ends with a checkpoint (``run.epoch_end``), and the run
    stops there if ``trainer.early_stopping`` says so. A run that stops mid-epoch (``max_steps``,
    or :class:`~ddlkit.rank.preemption.Preempted` raised out of ``run.step_end``) has
    checkpointed at that step; at ``max_steps`` it validates what it has without ending the
    epoch, so that a resumed run finishes the epoch."""
    stopped = run.finished
    clock = run.telemetry
    for epoch in range(run.state.epoch, run.cfg.trainer.epochs):
        if stopped:
            break
        items = iter(batches(epoch, run.state.batch))
        while True:
            with clock.phase("data"):
                batch = next(items, _END)
            if batch is _END:
                break
            lr = run.schedule(run.state.step)
            with clock.phase("step"):
                loss = step(batch, lr)
            if run.step_end(loss=loss, lr=lr):
                stopped = True
                break
        metrics = dict(evaluate()) if evaluate is not None else {}
        if stopped and run.state.batch < run.steps_per_epoch:
            if metrics:
                run.validation_end(**metrics)
            break
        if run.epoch_end(**metrics):
            break
