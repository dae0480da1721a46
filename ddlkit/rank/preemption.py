"""Stopping on SIGTERM (a preemption, a cancel): before training starts a rank stops at once;
once it trains, it checkpoints at the next step boundary the ranks agree on, then stops
(:class:`Preempted`, which the worker turns into ``EXIT_PREEMPTED``)."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..interfaces import DistView


class Preempted(Exception):
    """Raised out of the training loop after a SIGTERM's checkpoint was written, or at once by a
    SIGTERM that came before training started (``checkpointed=False``: there was nothing to save)."""

    def __init__(self, message: str, *, checkpointed: bool = True) -> None:
        super().__init__(message)
        self.checkpointed = checkpointed


def stop_at_once(signum: int, frame: object) -> None:
    """The SIGTERM handler until training starts (staging a dataset, building the model): there
    is nothing to checkpoint, and a stalled download must not hold the stop until the scheduler's
    kill after its grace period."""
    raise Preempted(f"stopped by {signal.Signals(signum).name} before training started", checkpointed=False)


class StopRequest:
    """Whether this rank was asked to stop, and when the ranks act on it."""

    def __init__(self) -> None:
        #: this rank was asked to stop (SIGTERM); ranks act on it together, see :meth:`agreed`
        self.requested = False
        #: set when training starts: from then on a SIGTERM checkpoints at the next step boundary; before, it
        #: stops at once
        self.training = False

    def install(self) -> None:
        """SIGTERM (preemption, cancel) -> checkpoint at the next step boundary, then exit."""

        def request_stop(signum: int, frame: object) -> None:
            self.requested = True
            if not self.training:
                stop_at_once(signum, frame)

        signal.signal(signal.SIGTERM, request_stop)

    def agreed(self, dist: DistView, step: int, check_every: int) -> bool:
        """Whether the loop stops at 1-based ``step`` for a stop request. A SIGTERM reaches the
        ranks at different moments (or only some of them), but a rank that leaves the loop alone
        would leave the others waiting forever in their next gradient all-reduce; so every
        ``check_every`` (``dist.stop_check_every``) steps the ranks all-reduce their flags and all
        stop at the same step if any of them was asked to. One process decides alone, at no cost."""
        if dist.world_size == 1:
            return self.requested
        if step % check_every:
            return False
        # never assign the agreed value to requested: a SIGTERM handled while this rank waits in
        # the exchange would be overwritten by the others' False and lost
        return dist.any(self.requested)
