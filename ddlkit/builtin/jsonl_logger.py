"""One JSON line per logging step (`loss`, `lr`, `images_per_sec`, ...) and per validation, in
`metrics.jsonl` in the job directory, on rank 0. It is in the default `logger` list.

    ddlkit 'logger=[console,jsonl]' trainer.log_every=10

A restarted or resumed job is one file whose step axis stays monotone: the lines logged after the
checkpoint the job resumes from are dropped before the new ones are written
([Failures, restarts and elastic jobs](../failures.md#the-loggers-continue)).

## How it works

Each line is appended as it is logged; the file is rewritten atomically only when a resume drops
the lines past its checkpoint.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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
            keep = [
                ln
                for ln, record in _records(self.path)
                if record is not None and record.get("step", 0) <= run.resumed_at.step
            ]
            write_text(self.path, "".join(ln + "\n" for ln in keep))
        elif run.resumed_at is None and self.path.exists():
            self.path.unlink()
        self.file = open(self.path, "a", encoding="utf-8", buffering=1)

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        record = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        self.file.write(json.dumps(record) + "\n")

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        self.file.close()


def _records(path: Path) -> list[tuple[str, dict[str, Any] | None]]:
    """Each line of a metrics file and its record; a line that is not one (torn by a crash while it was
    written) is dropped, and said once: it must not keep a job from resuming."""
    lines = []
    torn = 0
    for ln in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not ln.strip():
            continue
        try:
            record = json.loads(ln)
        except ValueError:
            torn += 1
            continue
        lines.append((ln, record if isinstance(record, dict) else None))
    if torn:
        print(
            f"ddlkit: {path}: dropped {torn} line(s) that are not complete JSON (a crash while it was written)",
            file=sys.stderr,
            flush=True,
        )
    return lines


@hookimpl
def ddlkit_loggers():
    yield Registration("jsonl", JsonlLogger, config=JsonlLoggerConfig, description="metrics.jsonl in the job directory")
