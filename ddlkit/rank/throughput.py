"""Images/sec measured the way ``tf_cnn_benchmarks`` does: warm-up steps excluded.

The clock covers the training steps only (input wait included, since it is part of what a
user gets); time spent in validation or checkpointing is cut out with :meth:`pause`.
"""

from __future__ import annotations

import time


class ThroughputMeter:
    def __init__(self, global_batch: int, warmup_steps: int) -> None:
        self.global_batch = global_batch
        self.warmup_steps = warmup_steps
        self.steps_seen = 0
        self.measured_steps = 0
        self.measured_time = 0.0
        self._last: float | None = None
        # sliding window for the "current" rate shown in progress lines
        self._window_start: tuple[int, float] | None = None

    def tick(self) -> None:
        """Call once after every optimizer step."""
        now = time.perf_counter()
        self.steps_seen += 1
        if self._last is not None and self.steps_seen > self.warmup_steps:
            self.measured_steps += 1
            self.measured_time += now - self._last
        self._last = now
        if self._window_start is None:
            # the display's window opens at the first step (of the run, or after a pause), so the
            # first progress line of a run, resumed or not, has a rate to show
            self._window_start = (self.steps_seen, now)

    def pause(self) -> None:
        """Stop the clock (e.g. before validation); the next tick restarts it without counting."""
        self._last = None
        self.steps_seen = max(self.steps_seen, self.warmup_steps)  # no second warm-up after a pause
        self._window_start = None

    def recent_rate(self) -> float | None:
        """Images/sec since the previous call (for progress display); None before two steps
        were timed since the start or a pause."""
        now = time.perf_counter()
        start = self._window_start
        self._window_start = (self.steps_seen, now)
        if start is None or now <= start[1] or self.steps_seen == start[0]:
            return self.images_per_sec or None
        return (self.steps_seen - start[0]) * self.global_batch / (now - start[1])

    @property
    def images_per_sec(self) -> float:
        if self.measured_time <= 0:
            return 0.0
        return self.measured_steps * self.global_batch / self.measured_time
