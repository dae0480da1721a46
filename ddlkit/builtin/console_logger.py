"""``logger=console``: progress and a summary for humans, on rank 0.

The worker writes plain progress lines (readable in ``rank-0.log`` and in a remote cluster's
log stream alike). The launcher, when its own stdout is a terminal, turns those lines back
into a live Rich progress bar (:class:`ProgressRenderer`), so the display is the same for
every compute target and the logs stay free of terminal control codes.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

from ..hookspecs import hookimpl
from ..interfaces import Logger
from ..registry import Registration

if TYPE_CHECKING:
    from ..run import Run

PROGRESS_RE = re.compile(
    r"^train epoch (?P<epoch>\d+)/(?P<epochs>\d+) step (?P<step>\d+)/(?P<total>\d+) "
    r"loss (?P<loss>\S+) lr (?P<lr>\S+) img/s (?P<ips>\S+) eta (?P<eta>\S+)$"
)


@dataclass
class ConsoleLoggerConfig:
    # print the summary table at the end of the run
    summary: bool = True


def _eta(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds))) if seconds == seconds and seconds < 1e7 else "?"


class ConsoleLogger(Logger):
    def __init__(self, cfg: ConsoleLoggerConfig, stream: TextIO | None = None) -> None:
        super().__init__(cfg)
        self.stream = stream or sys.stdout

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def start(self, run: Run) -> None:
        self.run = run
        self.t0 = time.perf_counter()
        self.step0 = run.state.step
        c, info = run.cfg, run.data.info
        self._print(
            f"ddlkit: {c.framework.name} {c.model.name} on {c.data.name} data ({info.image_size}px, "
            f"{info.num_classes} classes) | {run.dist.world_size} rank(s) x batch {c.trainer.batch_size} "
            f"= {run.global_batch} | {run.total_steps} steps ({run.steps_per_epoch}/epoch) | peak lr "
            f"{run.schedule.peak_lr:.4g}"
        )
        if run.resumed_at is not None:
            self._print(f"resumed from {run.resume_from} at epoch {run.state.epoch + 1}, step {run.state.step}")

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        run = self.run
        if split == "train":
            done = step - self.step0
            rate = done / (time.perf_counter() - self.t0) if done else 0.0
            eta = (run.total_steps - step) / rate if rate else float("nan")
            epoch = min(int(metrics["epoch"]) + 1, run.cfg.trainer.epochs)
            self._print(
                f"train epoch {epoch}/{run.cfg.trainer.epochs} step {step}/{run.total_steps} "
                f"loss {metrics['loss']:.4f} lr {metrics['lr']:.6f} img/s {metrics['images_per_sec']:.1f} "
                f"eta {_eta(eta)}"
            )
        else:
            parts = [f"{k} {v:.4f}" for k, v in metrics.items() if k != "epoch"]
            self._print(f"epoch {metrics['epoch']:.3g}/{run.cfg.trainer.epochs} validation: " + "  ".join(parts))

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        if result is None or not self.cfg.summary:
            self._print(f"run {status}")
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"ddlkit run {status}", show_header=False)
        for key in ("framework", "model", "world_size", "global_batch_size", "epochs", "steps",
                    "images_per_sec", "final_loss", "top1", "top5", "wall_time_s"):
            value = result.get(key)
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        Console(file=self.stream, force_terminal=False, width=80).print(table)


class ProgressRenderer:
    """Launcher side: shows a worker's progress lines as a live bar, other lines as they come."""

    def __init__(self, out: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=out or sys.stdout)
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[ips]} img/s"),
            TextColumn("eta {task.fields[eta]}"), TimeElapsedColumn(), console=self.console, transient=False,
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
            m = PROGRESS_RE.match(line.rstrip("\r"))
            if not m:
                self.progress.console.print(line, markup=False, highlight=False)
                continue
            fields = {"epoch": f"{m['epoch']}/{m['epochs']}", "loss": m["loss"], "ips": m["ips"], "eta": m["eta"]}
            if self.task is None:
                self.task = self.progress.add_task("train", total=int(m["total"]), **fields)
            self.progress.update(self.task, completed=int(m["step"]), total=int(m["total"]), **fields)


@hookimpl
def ddlkit_loggers():
    yield Registration("console", ConsoleLogger, config=ConsoleLoggerConfig,
                       description="progress lines and a summary on rank 0 (a live bar in a terminal)")
