"""Where ``ddlkit jobs`` finds a job again: its submission record, and an index of recent jobs.

* ``<job_dir>/`` :data:`~ddlkit.jobdir.SUBMISSION_FILE` -- the job's own record: its name, the compute target
  that runs it and the target's id for it, when it was submitted, and the last state the
  launcher saw (rewritten when the job ends). The job directory is self-describing: ``ddlkit
  jobs status <job dir>`` works wherever the directory is.
* ``<state dir>/jobs/<name>.json`` -- a pointer per job (name, job directory, target, submitted),
  so that ``ddlkit jobs list`` and ``ddlkit jobs status <name>`` work from any directory. The
  state directory is ``$DDLKIT_STATE_DIR``, else ``$XDG_STATE_HOME/ddlkit``, else
  ``~/.local/state/ddlkit``.

Both are written atomically (one file per job: concurrent launchers never rewrite each other's
records) and hold nothing secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import write_json
from ..compute.state import STATE_DIR_ENV, state_dir
from ..errors import ConfigError, DdlkitError
from ..interfaces import ComputeTarget, JobHandle, JobState, JobStatus
from ..jobdir import JOB_FILE, SUBMISSION_FILE, rank_log

if TYPE_CHECKING:
    from ..registry import Registry


def _index_dir() -> Path:
    return state_dir() / "jobs"


def _unwritable(err: OSError) -> str:
    """Why the index cannot be written, and how to give it a place (the variable that chose it)."""
    chosen = next((f" (${name})" for name in (STATE_DIR_ENV, "XDG_STATE_HOME") if os.environ.get(name)), "")
    return (
        f"the job index's directory {_index_dir()}{chosen} cannot be written ({err.strerror or err}): set "
        f"{STATE_DIR_ENV} to a writable directory"
    )


def require_writable() -> None:
    """Raise ConfigError unless the index can be written: a detached job is found again only through it."""
    try:
        _index_dir().mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=_index_dir()).close()
    except OSError as err:
        raise ConfigError(
            f"--detach records the job in the job index, to find it again: {_unwritable(err)}, or run without --detach."
        ) from None


#: whether the warning that the index cannot be written was printed (once per process: a sweep records many jobs)
_warned = False


@dataclass
class Submission:
    name: str
    job_dir: str
    #: the compute target's name (``compute=<target>``) and its id for the job
    target: str
    id: str
    submitted: float
    host: str = ""
    #: the last state the launcher saw: pending, running, succeeded, failed, cancelled
    state: str = "running"
    exit_code: int | None = None
    #: when the launcher first saw the job end (after its files were brought back); None until then
    ended: float | None = None
    detached: bool = False
    #: the target's explanation of the end (which rank failed, its last lines)
    message: str = ""
    #: the restarts after the infrastructure ended the job (ddlkit.compute.restarts): cause, step
    #: reached, step resumed from, steps lost, the target's id of the run that ended (``ended_id``);
    #: this submission is the last one
    restarts: list[dict[str, Any]] = field(default_factory=list)
    #: what a sweep's early stopping decided when this run ended ("paused at 3 epochs: ..."), shown
    #: by ``ddlkit jobs status``: a paused or pruned trial's run succeeded, but the trial went no further
    sweep_decision: str = ""

    @property
    def path(self) -> Path:
        return Path(self.job_dir) / SUBMISSION_FILE

    def save(self) -> None:
        write_json(self.path, asdict(self))

    def handle(self, registry: Registry) -> JobHandle:
        """Rebuild the job's compute target from its job file, and attach to the job; a job whose end
        is recorded is answered from its record instead (:class:`EndedJob`)."""
        if self.ended is not None:
            return EndedJob(self)
        return self.compute_target(registry).attach(self.id, job_dir=Path(self.job_dir))

    def compute_target(self, registry: Registry) -> ComputeTarget:
        """The job's compute target, rebuilt from its job file."""
        from ..config import rebuild

        try:
            config = json.loads((Path(self.job_dir) / JOB_FILE).read_text(encoding="utf-8"))["config"]
            compute = rebuild(config, registry, groups=("compute",)).compute
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(
                f"{Path(self.job_dir) / JOB_FILE} is missing or unreadable ({err}); cannot reach job {self.name}."
            ) from None
        return registry.create("compute", compute.name, compute)

    def ended_with(self, status: JobStatus) -> None:
        """Record the end the launcher saw, once the job's files are back (``JobHandle.collect``),
        and the restarts its target made in place (:attr:`JobStatus.restarts`); seeing it again
        (``ddlkit jobs attach`` of an ended job) keeps the time it was first seen and adds nothing."""
        self.state, self.exit_code, self.message = status.state.value, status.exit_code, status.message
        if self.ended is None:
            self.restarts = [*self.restarts, *({**entry, "ended_id": self.id} for entry in status.restarts)]
        self.ended = self.ended or time.time()
        self.save()


class EndedJob(JobHandle):
    """A job whose end is recorded, answered from its job directory without asking its target:
    a target may no longer reach a job that has ended (a cluster's disk was cleaned, a service
    forgot the job) or never could attach at all, and the record is written only after the job's
    files came back, so the directory holds rank 0's output and, if it completed, ``result.json``."""

    def __init__(self, sub: Submission) -> None:
        self.sub, self.id = sub, sub.id
        self._read = False

    def status(self) -> JobStatus:
        return JobStatus(JobState(self.sub.state), self.sub.exit_code, self.sub.message)

    def logs(self, follow: bool = True) -> Iterator[str]:
        """Rank 0's whole output on the first call, as :meth:`JobHandle.logs` of a job that ended;
        nothing after it."""
        if self._read:
            return
        self._read = True
        try:
            with open(Path(self.sub.job_dir) / rank_log(0), encoding="utf-8", errors="replace") as log:
                while chunk := log.read(1 << 16):
                    yield chunk
        except FileNotFoundError:
            return  # the job ended before rank 0 started: it has no output

    def cancel(self) -> None:
        pass  # it has ended

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self.status()


def record(
    name: str, job_dir: Path, target: str, job_id: str, *, detached: bool = False, restart: dict[str, Any] | None = None
) -> Submission:
    """Record a job that was just submitted: in its job directory and in the index. ``restart``: it
    was submitted again after the infrastructure ended it; the earlier restarts stay in the record."""
    earlier: list[dict[str, Any]] = []
    if restart is not None:
        with contextlib.suppress(DdlkitError):
            ended = load(job_dir)
            earlier, restart = ended.restarts, {**restart, "ended_id": ended.id}
    sub = Submission(
        name,
        str(Path(job_dir).resolve()),
        target,
        job_id,
        time.time(),
        socket.gethostname(),
        detached=detached,
        restarts=[*earlier, restart] if restart is not None else [],
    )
    sub.save()
    try:
        write_json(
            _index_dir() / f"{name}.json",
            {"name": name, "job_dir": sub.job_dir, "target": target, "submitted": sub.submitted},
        )
    except OSError as err:
        # the job runs all the same: `ddlkit jobs` finds it by its directory, which holds its record
        global _warned
        if not _warned:
            print(
                f"ddlkit: warning: {_unwritable(err)}; until then `ddlkit jobs` finds jobs by their directory only "
                "(`ddlkit jobs status <job dir>`).",
                file=sys.stderr,
                flush=True,
            )
            _warned = True
    return sub


def load(job_dir: Path) -> Submission:
    path = Path(job_dir) / SUBMISSION_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(Submission)}
        return Submission(**{k: v for k, v in data.items() if k in known})
    except FileNotFoundError:
        if (Path(job_dir) / JOB_FILE).is_file():
            raise ConfigError(
                f"{job_dir} is a ddlkit job directory, but its job was never submitted (no "
                f"{SUBMISSION_FILE}): run it with `ddlkit ... hydra.run.dir={job_dir}`."
            ) from None
        raise ConfigError(f"{job_dir} is not a ddlkit job directory (it has no {JOB_FILE}).") from None
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(f"{path} is not a readable submission record ({err}).") from None


def recent(limit: int | None = 20) -> list[dict[str, Any]]:
    """Index entries, newest first (unreadable entries are skipped)."""
    entries = []
    for path in _index_dir().glob("*.json"):
        try:
            entries.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    entries.sort(key=lambda e: e.get("submitted", 0), reverse=True)
    return entries if limit is None else entries[:limit]


def find(ref: str) -> Submission:
    """The job ``ref`` names: a job directory, a job name, or a unique prefix of a name."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return load(path)
    entries = recent(limit=None)
    matches = [e for e in entries if e["name"] == ref] or [e for e in entries if e["name"].startswith(ref)]
    if len(matches) == 1:
        job_dir = Path(matches[0]["job_dir"])
        if not job_dir.is_dir():
            raise ConfigError(f"job {matches[0]['name']}'s directory {job_dir} no longer exists.")
        return load(job_dir)
    if len(matches) > 1:
        raise ConfigError(
            f"{ref!r} names {len(matches)} jobs: {', '.join(e['name'] for e in matches[:10])}. Give more of the name."
        )
    names = ", ".join(e["name"] for e in entries[:10]) or "none recorded yet"
    raise ConfigError(
        f"unknown job {ref!r}: not a job directory nor a recorded job name. Recent jobs: {names} (`ddlkit jobs list`)."
    )
