"""``logger=jsonl``: one JSON line per logging step and per validation, in metrics.jsonl."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..atomic import write_text
from ..hookspecs import hookimpl
from ..interfaces import Logger
from ..jobdir import METRICS_FILE
from ..registry import Registration

if TYPE_CHECKING:
    from ..interfaces import RunContext


@dataclass
class JsonlLoggerConfig:
    # file name inside the job directory
    filename: str = METRICS_FILE


class JsonlLogger(Logger):
    def start(self, run: RunContext) -> None:
        self.path = run.job_dir / self.cfg.filename
        if run.resumed_at is not None and self.path.exists():
            # drop lines logged after the checkpoint we resume from: they will be logged again
            keep = [ln for ln in self.path.read_text(encoding="utf-8").splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= run.resumed_at.step]
            write_text(self.path, "".join(ln + "\n" for ln in keep))
        elif run.resumed_at is None and self.path.exists():
            self.path.unlink()
        self.file = open(self.path, "a", encoding="utf-8", buffering=1)

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        record = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        self.file.write(json.dumps(record) + "\n")

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        self.file.close()


@hookimpl
def ddlkit_loggers():
    yield Registration("jsonl", JsonlLogger, config=JsonlLoggerConfig, description="metrics.jsonl in the job directory")
