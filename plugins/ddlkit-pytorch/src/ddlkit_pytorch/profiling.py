"""``trainer.profile`` for ``framework=pytorch``: ``torch.profiler`` over the window's steps.

Each rank writes one Chrome/Perfetto trace with ``torch.profiler.tensorboard_trace_handler``:
``<job dir>/profile/plugins/profile/steps_<first>-<last>/rank<N>.<ns>.pt.trace.json``. The window's
steps are marked in it as ``ProfilerStep#<step>``, numbered as ddlkit counts optimizer steps (1-based).
CPU activity always, CUDA's on a GPU; no shapes, stacks or memory unless asked
(``framework.profile_memory``), which keeps the traces small and the window's own overhead low.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ddlkit


class TorchProfiler(ddlkit.Profiler):
    def __init__(self, out_dir: Path, *, rank: int, cuda: bool, memory: bool = False) -> None:
        self.out_dir = out_dir
        self.rank = rank
        self.cuda = cuda
        self.memory = memory
        self._prof: Any = None

    def start(self, steps: range) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        run_dir = self.out_dir / "plugins" / "profile" / f"steps_{steps[0]}-{steps[-1]}"
        prof = torch.profiler.profile(
            activities=activities,
            # a schedule (every step recorded) makes torch mark each step as ProfilerStep#<n>
            schedule=lambda step: torch.profiler.ProfilerAction.RECORD,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(run_dir), worker_name=f"rank{self.rank}"),
            record_shapes=False,
            profile_memory=self.memory,
            with_stack=False,
        )
        # the marks count from here: ProfilerStep#<first step of the window>, not #0
        prof.step_num = steps[0]
        prof.start()
        self._prof = prof

    def step(self, step: int) -> None:
        self._prof.step()

    def stop(self) -> None:
        prof, self._prof = self._prof, None
        prof.stop()  # writes the trace (on_trace_ready)
