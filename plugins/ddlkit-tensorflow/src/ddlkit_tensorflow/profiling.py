"""``trainer.profile`` for ``framework=tensorflow`` and ``framework=keras``: TensorFlow's profiler
over the window's steps.

``tf.profiler.experimental.start`` and ``stop`` around the window, each rank into a directory of its
own (the ranks of a node would write the same ``<host>.xplane.pb``):
``<job dir>/profile/rank<N>/plugins/profile/<time>/<host>.xplane.pb``, which TensorBoard's profile
plugin reads (``tensorboard --logdir <job dir>/profile``). Each step of the window is a ``train``
step trace (``tf.profiler.experimental.Trace(step_num=...)``), numbered as ddlkit counts optimizer
steps (1-based), so the plugin's step-time views have the steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ddlkit


class TensorflowProfiler(ddlkit.Profiler):
    def __init__(self, out_dir: Path, *, rank: int) -> None:
        self.logdir = out_dir / f"rank{rank}"
        self._trace: Any = None

    def start(self, steps: range) -> None:
        import tensorflow as tf

        tf.profiler.experimental.start(str(self.logdir))
        self._mark(steps[0])

    def step(self, step: int) -> None:
        self._mark(step + 1)

    def stop(self) -> None:
        import tensorflow as tf

        self._mark(None)
        tf.profiler.experimental.stop()  # writes the trace

    def _mark(self, step: int | None) -> None:
        """End the current step's trace and, unless ``step`` is None, begin ``step``'s."""
        import tensorflow as tf

        if self._trace is not None:
            self._trace.__exit__(None, None, None)
            self._trace = None
        if step is not None:
            self._trace = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
            self._trace.__enter__()
