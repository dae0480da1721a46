"""The launcher's live progress bar: rank 0's progress lines (:data:`ddlkit.jobdir.PROGRESS_LINE`,
written by the console logger) drawn as a bar while the job's other lines pass through."""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

from ..jobdir import PROGRESS_PATTERN

_PROGRESS = re.compile(PROGRESS_PATTERN)


class ProgressRenderer:
    """Launcher side: shows a worker's progress lines as a live bar, other lines as they come."""

    def __init__(self, out: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=out or sys.stdout)
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[ips]} {task.fields[unit]}/s"),
            TextColumn("eta {task.fields[eta]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task: Any = None
        self._buf = ""

    def __enter__(self) -> ProgressRenderer:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.feed("\n") if self._buf else None
        self.progress.stop()

    def feed(self, chunk: str) -> None:
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            m = _PROGRESS.match(line.rstrip("\r"))
            if not m:
                self.progress.console.print(line, markup=False, highlight=False)
                continue
            fields = {
                "epoch": f"{m['epoch']}/{m['epochs']}",
                "loss": m["loss"],
                "ips": m["ips"],
                "unit": m["unit"],
                "eta": m["eta"],
            }
            if self.task is None:
                self.task = self.progress.add_task("train", total=int(m["total"]), **fields)
            self.progress.update(self.task, completed=int(m["step"]), total=int(m["total"]), **fields)
