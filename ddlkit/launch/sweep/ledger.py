"""The sweep ledger: ``<sweep dir>/ledger.json``, one record per job.

It is what makes a sweep resumable: re-running the same command with the same
``hydra.sweep.dir`` finds it, keeps every job's number and directory, skips the completed jobs
and re-runs the others (in their own directories, so they continue from their checkpoints).

Each change (a job started, a job ended) is appended to ``ledger.journal.jsonl`` as one line at
once, and ``ledger.json`` is rewritten (atomically) at most once every ``SAVE_DELAY_S`` seconds
after a change, at once when the journal holds as many lines as the ledger has jobs, and at the
end of the sweep: a reader of ledger.json is never more than a second behind, and a sweep of N
jobs no longer writes O(N^2) bytes of ledger (rewriting it on every change did). Opening a
ledger replays its journal, so a launcher killed at any point loses no change it had made.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ...atomic import write_json
from ...errors import ConfigError
from ...result import LEDGER

LEDGER_FILE = "ledger.json"
JOURNAL_FILE = "ledger.journal.jsonl"
#: the journal is folded into ledger.json when it has this many lines, or as many as the ledger has jobs
MIN_JOURNAL_LINES = 64
#: and at the latest this long after a change
SAVE_DELAY_S = 1.0
VERSION = 1
#: result.json fields kept in the ledger (and shown in the report)
RESULT_FIELDS = tuple(f.name for f in LEDGER)


@dataclass
class JobRecord:
    num: int
    #: the job's task overrides, as the sweeper expanded them (secrets redacted)
    overrides: list[str]
    job_dir: str
    #: pending, running, completed, failed, cancelled or interrupted (see ddlkit.launch.sweep.scheduler);
    #: under sweep.early_stopping also paused, pruned or promoted (see ddlkit.launch.sweep.halving)
    status: str = "pending"
    #: attempts so far, across resumes: the first run and the sweep's retries (sweep.on_failure=retry:N)
    attempts: int = 0
    #: restarts by the compute target's restart policy (restart.max_restarts), all attempts together,
    #: and the steps they lost (run past a checkpoint, then run again); no attempt of their own
    restarts: int = 0
    steps_lost: int = 0
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
    #: the RESULT_FIELDS of result.json, once completed (under early stopping: of its last segment)
    result: dict[str, Any] | None = None
    #: sweep.early_stopping: the metric's value at each milestone the trial reached ({"3": 0.52}),
    #: the end of the last segment it was given (its budget so far), and each segment it ran
    #: ({"started": t, "ended": t, "from": 1, "to": 3}: epochs or steps)
    rung_values: dict[str, float] | None = None
    target: int | None = None
    segments: list[dict[str, Any]] | None = None
    #: and the last decision on it: "paused at 3 epochs: 4 of 9 at 3 epochs by val_top1 (0.41); the top 3 go on"
    decision: str | None = None


@dataclass
class Ledger:
    path: Path
    name: str
    jobs: dict[int, JobRecord] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    #: the command that ran the sweep most recently (secrets redacted)
    command: list[str] = field(default_factory=list)
    #: sweep.early_stopping, when it stops trials: rule, metric, maximize, unit, milestones
    early_stopping: dict[str, Any] | None = None
    #: changes appended to the journal since ledger.json was last written
    _journal_lines: int = field(default=0, repr=False)
    #: the pending delayed save, and the lock that keeps it and update() apart
    _timer: threading.Timer | None = field(default=None, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @classmethod
    def open(cls, sweep_dir: Path, name: str) -> Ledger:
        """The ledger of ``sweep_dir``: the existing one (to resume), or a new, empty one."""
        path = Path(sweep_dir) / LEDGER_FILE
        if not path.is_file():
            return cls(path, name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            known = {f.name for f in fields(JobRecord)}
            jobs = {
                int(num): JobRecord(**{k: v for k, v in rec.items() if k in known}) for num, rec in data["jobs"].items()
            }
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(
                f"{path} is not a readable sweep ledger ({err}). Move it away to start the sweep "
                "afresh, or use another hydra.sweep.dir."
            ) from None
        ledger = cls(path, data.get("name", name), jobs, data.get("created", time.time()), data.get("command", []))
        ledger.early_stopping = data.get("early_stopping")
        ledger._replay()
        return ledger

    @property
    def journal(self) -> Path:
        return self.path.parent / JOURNAL_FILE

    def _replay(self) -> None:
        """Apply the changes the journal holds beyond ledger.json (a launcher that died mid-sweep)."""
        try:
            lines = self.journal.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                change = json.loads(line)
            except ValueError:  # the last line, cut short when the launcher died
                continue
            record = self.jobs.get(int(change.pop("num", -1)))
            if record is not None:
                for key, value in change.items():
                    setattr(record, key, value)

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
                    "sweep its own hydra.sweep.dir."
                )
            if known.status == "completed":
                done.append(num)
        return done

    def update(self, num: int, **changes: Any) -> None:
        with self._lock:
            record = self.jobs[num]
            for key, value in changes.items():
                setattr(record, key, value)
            if not self.path.is_file():  # the journal holds changes to ledger.json's records: write those first
                self.save()
                return
            with self.journal.open("a", encoding="utf-8") as journal:
                journal.write(json.dumps({"num": num, **changes}) + "\n")
            self._journal_lines += 1
            if self._journal_lines >= max(MIN_JOURNAL_LINES, len(self.jobs)):
                self.save()
            elif self._timer is None:
                self._timer = threading.Timer(SAVE_DELAY_S, self.save)
                self._timer.daemon = True
                self._timer.start()

    def save(self) -> None:
        """Rewrite ledger.json with every change, and start an empty journal."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            write_json(
                self.path,
                {
                    "version": VERSION,
                    "name": self.name,
                    "sweep_dir": str(self.path.parent),
                    "created": self.created,
                    "updated": time.time(),
                    "command": self.command,
                    **({"early_stopping": self.early_stopping} if self.early_stopping else {}),
                    "jobs": {str(num): asdict(rec) for num, rec in sorted(self.jobs.items())},
                },
            )
            self.journal.unlink(missing_ok=True)
            self._journal_lines = 0


def result_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in RESULT_FIELDS}
