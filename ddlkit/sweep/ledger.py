"""The sweep ledger: ``<sweep dir>/ledger.json``, one record per job, rewritten atomically on every change.

It is what makes a sweep resumable: re-running the same command with the same
``hydra.sweep.dir`` finds it, keeps every job's number and directory, skips the completed jobs
and re-runs the others (in their own directories, so they continue from their checkpoints).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..errors import ConfigError

LEDGER_FILE = "ledger.json"
VERSION = 1
#: result.json fields kept in the ledger (and shown in the report)
RESULT_FIELDS = ("images_per_sec", "final_loss", "best_top1", "top1", "top5", "val_loss", "steps", "epochs",
                 "world_size", "global_batch_size", "wall_time_s")


@dataclass
class JobRecord:
    num: int
    #: the job's task overrides, as the sweeper expanded them (secrets redacted)
    overrides: list[str]
    job_dir: str
    #: pending, running, completed, failed, cancelled or interrupted (see ddlkit.sweep.scheduler)
    status: str = "pending"
    #: attempts so far, across resumes
    attempts: int = 0
    #: wall-clock times of the last attempt: submitted (prepare starts), started (handle back), ended (end seen)
    submitted: float | None = None
    started: float | None = None
    ended: float | None = None
    #: seconds run, all attempts together
    duration_s: float | None = None
    exit_code: int | None = None
    error: str | None = None
    #: the job's rank-0 log (or the command that shows it)
    log: str | None = None
    #: the job's name (``ddlkit jobs`` finds it by it) and its compute target's id for the last attempt
    name: str | None = None
    handle: str | None = None
    #: the RESULT_FIELDS of result.json, once completed
    result: dict[str, Any] | None = None


@dataclass
class Ledger:
    path: Path
    name: str
    jobs: dict[int, JobRecord] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    #: the command that ran the sweep most recently (secrets redacted)
    command: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, sweep_dir: Path, name: str) -> Ledger:
        """The ledger of ``sweep_dir``: the existing one (to resume), or a new, empty one."""
        path = Path(sweep_dir) / LEDGER_FILE
        if not path.is_file():
            return cls(path, name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            known = {f.name for f in fields(JobRecord)}
            jobs = {int(num): JobRecord(**{k: v for k, v in rec.items() if k in known})
                    for num, rec in data["jobs"].items()}
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{path} is not a readable sweep ledger ({err}). Move it away to start the sweep "
                              "afresh, or use another hydra.sweep.dir.") from None
        return cls(path, data.get("name", name), jobs, data.get("created", time.time()), data.get("command", []))

    def reconcile(self, jobs: Iterable[tuple[int, list[str], str]]) -> list[int]:
        """Add ``(num, overrides, job_dir)`` for jobs the ledger lacks; check the others are the same
        jobs (a sweep dir holds one sweep). Returns the numbers of the jobs already completed."""
        done = []
        for num, overrides, job_dir in jobs:
            known = self.jobs.get(num)
            if known is None:
                self.jobs[num] = JobRecord(num, list(overrides), job_dir)
                continue
            if known.overrides != list(overrides):
                raise ConfigError(
                    f"{self.path.parent} holds another sweep: its job #{num} was {' '.join(known.overrides) or '-'}, "
                    f"this sweep's is {' '.join(overrides) or '-'}. Resume with the same command, or give this "
                    "sweep its own hydra.sweep.dir.")
            if known.status == "completed":
                done.append(num)
        return done

    def update(self, num: int, **changes: Any) -> None:
        record = self.jobs[num]
        for key, value in changes.items():
            setattr(record, key, value)
        self.save()

    def save(self) -> None:
        write_json(self.path, {
            "version": VERSION, "name": self.name, "sweep_dir": str(self.path.parent), "created": self.created,
            "updated": time.time(), "command": self.command,
            "jobs": {str(num): asdict(rec) for num, rec in sorted(self.jobs.items())},
        })


def result_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in RESULT_FIELDS}
