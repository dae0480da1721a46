"""TensorBoard scalars, written on rank 0.

    ddlkit 'logger=[console,jsonl,tensorboard]'
    tensorboard --logdir outputs/            # or a sweep directory, to compare its jobs

Two event directories per job, which TensorBoard shows as two runs:

| directory | x axis | scalars |
|---|---|---|
| `<job dir>/tensorboard` | global step | `train/loss`, `train/lr`, `train/images_per_sec`, `train/epoch`; `val/val_loss`, `val/val_top1`, `val/val_top5` at the step each validation ran |
| `<job dir>/tensorboard/epoch` | epoch | `epoch/val_loss`, `epoch/val_top1`, `epoch/val_top5` |

Every event is flushed as it is written: the files are complete whenever the job stops. A resumed
job first writes a session-start marker at the step it resumes from, so TensorBoard drops what the
interrupted attempt logged after its checkpoint instead of showing it twice.

## How it works

The files are written with `tensorboard`'s record writer and protos only: neither TensorFlow nor
PyTorch is imported (TensorBoard's `EventFileWriter` imports TensorFlow when it is installed, and
`torch.utils.tensorboard` imports torch: a run of the other framework would pay for either). The
plugin's tests (`cd plugins/ddlkit-tensorboard && python -m pytest`) read the event files back with
TensorBoard's `EventAccumulator`.
"""  # noqa: E501 -- a Markdown table: its rows cannot be wrapped

from __future__ import annotations

import itertools
import math
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ddlkit

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from tensorboard.compat.proto.event_pb2 import Event

    from ddlkit import RunContext

EPOCH_SUBDIR = "epoch"
_FILE_NUMBERS = itertools.count()


@dataclass
class TensorboardConfig:
    # event files go to <job dir>/<subdir> (per step) and <job dir>/<subdir>/epoch (per epoch)
    subdir: str = "tensorboard"


class EventFile:
    """One TensorBoard event file (named as TensorBoard's writers name them), written through."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_NUMBERS)}"
        )
        self._records = RecordWriter(open(self.path, "wb"))
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, event: Event) -> None:
        self._records.write(event.SerializeToString())
        self._records.flush()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
        self.write(Event(wall_time=time.time(), step=step, summary=summary))

    def purge_from(self, step: int) -> None:
        """TensorBoard discards this file's run's earlier events at ``step`` and after when it reads this."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.write(Event(wall_time=time.time(), step=step, session_log=SessionLog(status=SessionLog.START)))

    def close(self) -> None:
        self._records.close()


class TensorboardLogger(ddlkit.Logger):
    def configure(self, config: DictConfig) -> None:
        if find_spec("tensorboard") is None:
            raise ddlkit.ConfigError(
                "logger=tensorboard needs the tensorboard package: pip install tensorboard "
                "(or drop tensorboard from logger)."
            )
        subdir = self.cfg.subdir
        if not subdir or subdir.startswith(("/", "..")):
            raise ddlkit.ConfigError(
                f"logger.tensorboard.subdir={subdir} is invalid: it must be a relative path "
                "inside the job directory, e.g. tensorboard."
            )

    def start(self, run: RunContext) -> None:
        logdir = run.job_dir / self.cfg.subdir
        self.steps = EventFile(logdir)
        self.epochs = EventFile(logdir / EPOCH_SUBDIR)
        if run.resumed_at is not None:
            # what the interrupted attempt logged after its checkpoint is logged again by this one
            self.steps.purge_from(run.resumed_at.step + 1)
            self.epochs.purge_from(run.resumed_at.epoch + 1)

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        self.steps.scalars(
            step, {f"{split}/{key}": value for key, value in metrics.items() if not (split == "val" and key == "epoch")}
        )
        if split == "val":
            # a validation after a partial epoch (max_steps) counts for the epoch it happened in
            self.epochs.scalars(
                math.ceil(metrics["epoch"]), {f"epoch/{key}": value for key, value in metrics.items() if key != "epoch"}
            )

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        try:
            self.steps.close()
        finally:
            self.epochs.close()
