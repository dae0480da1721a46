"""Progress and a summary for people, on rank 0. It is in the default `logger` list, and loggers
combine: `logger=[console,jsonl,wandb,tensorboard]`.

    ddlkit 'logger=[console,jsonl]'          # the default
    ddlkit logger.console.summary=false      # no summary table at the end

A run prints, in order:

- **start-up**, with the seconds since the rank started, so the time before the first step is
  never silent: `ddlkit: [  0.4s] 2 ranks connected`, `model built (11.2M parameters)`,
  `data ready`, then the header, then `first step done` (a framework plugin adds its own phases
  with `run.phase("...")`; [Performance](../../explanation/performance.md#time-to-the-first-step)
  splits a job's time to the first step with them);
- **the header**: the data, the model, the world size and batch
  (`1 rank(s) x 2 thread(s) x batch 32`), and the peak learning rate and how it came about
  (`peak lr 0.0003536 (0.001 x sqrt(32/256): optimizer.scale_lr=sqrt)`);
- **progress**: a live bar in a terminal, plain lines in a log (`rank-0.log`, a cluster's log
  stream), with loss, learning rate, images/sec (samples/sec when the inputs are not images) and
  the time left;
- **the summary**: the result's main fields as a table (`logger.console.summary`).

## How it works

The worker writes plain progress lines (readable in `rank-0.log` and in a remote cluster's log
stream alike). The launcher, when its own stdout is a terminal, turns those lines back into a
live Rich progress bar (`ddlkit.launch.progress`; the line's format is
`ddlkit.jobdir.PROGRESS_LINE`), so the display is the same for every compute target and the logs
stay free of terminal control codes.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

from ..hookspecs import hookimpl
from ..interfaces import Logger
from ..jobdir import PROGRESS_LINE
from ..registry import Registration
from ..result import SUMMARY

if TYPE_CHECKING:
    from ..interfaces import RunContext


@dataclass
class ConsoleLoggerConfig:
    # print the summary table at the end of the run
    summary: bool = True


def describe_data(run: RunContext) -> str:
    """What the run trains on, as the header says it: images and classes when it has them, else
    samples (data=custom's own task: a regression, a loss of its own)."""
    info = run.data.info
    shape = [f"{info.image_size}px images"] if info.image_size else []
    task = [f"{info.num_classes} classes"] if info.num_classes else []
    parts = shape + task or [f"{info.train_length} samples"]
    return f"{run.cfg.data.name} data ({', '.join(parts)})"


def unit(run: RunContext) -> str:
    """What a throughput counts: images, or samples when the inputs are not images."""
    return "img" if run.data.info.image_size else "samples"


def _eta(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds))) if seconds == seconds and seconds < 1e7 else "?"


def _lr_rule(schedule: Any) -> str:
    """How the peak lr came about (optimizer.scale_lr), for the header."""
    rule = schedule.scaling.value
    ratio = f"{schedule.global_batch}/{schedule.reference_batch}"
    how = {
        "linear": f"{schedule.base_lr:.4g} x {ratio}",
        "sqrt": f"{schedule.base_lr:.4g} x sqrt({ratio})",
        "none": "as given",
    }[rule]
    return f"{how}: optimizer.scale_lr={rule}"


class ConsoleLogger(Logger):
    def __init__(self, cfg: ConsoleLoggerConfig, stream: TextIO | None = None) -> None:
        super().__init__(cfg)
        self.stream = stream or sys.stdout

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def start(self, run: RunContext) -> None:
        self.run = run
        self.t0 = time.perf_counter()
        self.step0 = run.state.step
        c, s = run.cfg, run.schedule
        threads = f" x {run.num_threads} thread(s)" if run.num_threads else ""
        accumulated = f" x {run.accumulate} accumulated" if run.accumulate > 1 else ""
        self._print(
            f"ddlkit: {c.framework.name} {c.model.name} on {describe_data(run)} | {run.dist.world_size} "
            f"rank(s){threads} x batch {c.trainer.batch_size}{accumulated} = {run.global_batch} | "
            f"{run.total_steps} steps ({run.steps_per_epoch}/epoch) | peak lr {s.peak_lr:.4g} ({_lr_rule(s)})"
        )
        if run.resumed_at is not None:
            self._print(f"resumed from {run.resume_from} at epoch {run.state.epoch + 1}, step {run.state.step}")

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        run = self.run
        if split == "train":
            done = step - self.step0
            rate = done / (time.perf_counter() - self.t0) if done else 0.0
            eta = (run.total_steps - step) / rate if rate else float("nan")
            # the epoch a step belongs to: its last step ends it (epoch 1.0 is epoch 1's)
            epoch = max(1, math.ceil(metrics["epoch"]))
            ips = metrics.get("images_per_sec")
            self._print(
                PROGRESS_LINE.format(
                    epoch=epoch,
                    epochs=run.cfg.trainer.epochs,
                    step=step,
                    total=run.total_steps,
                    loss=f"{metrics['loss']:.4f}",
                    lr=f"{metrics['lr']:.6f}",
                    unit=unit(run),
                    ips="-" if ips is None else f"{ips:.1f}",
                    eta=_eta(eta),
                )
            )
        else:
            parts = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "epoch")
            epochs, epoch = run.cfg.trainer.epochs, metrics["epoch"]
            if epoch == int(epoch):
                self._print(f"epoch {int(epoch)}/{epochs} validation: {parts}")
            else:  # a run that stopped mid-epoch (trainer.max_steps)
                self._print(f"step {step}/{run.total_steps} validation (in epoch {math.ceil(epoch)}/{epochs}): {parts}")

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        if result is None or not self.cfg.summary:
            self._print(f"run {status}")
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"ddlkit run {status}", show_header=False)
        for key in (f.name for f in SUMMARY):
            value = result.get(key)
            if value is None and key in ("top1", "top5"):
                continue  # not measured: another task, or no more classes than k
            name = "samples_per_sec" if key == "images_per_sec" and unit(self.run) == "samples" else key
            if key == "epochs":
                value = _epochs_trained(result, self.run.cfg.trainer.epochs)
            table.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
        Console(file=self.stream, force_terminal=False, width=80).print(table)


def _epochs_trained(result: Mapping[str, Any], planned: int) -> str:
    """The epochs trained, as a fraction where the run ended mid-epoch, and of how many where it
    ended early: result.json's ``epochs`` counts completed epochs only, so a run stopped in its
    first epoch would read "epochs 0" after its "epoch 1/2" progress lines."""
    steps, per_epoch = result.get("steps"), result.get("steps_per_epoch")
    if not steps or not per_epoch:
        return str(result.get("epochs"))
    trained = steps / per_epoch
    text = f"{trained:g}" if trained == int(trained) else f"{trained:.2f}"
    return text if trained >= planned else f"{text} of {planned}"


@hookimpl
def ddlkit_loggers():
    yield Registration(
        "console",
        ConsoleLogger,
        config=ConsoleLoggerConfig,
        description="progress lines and a summary on rank 0 (a live bar in a terminal)",
    )
