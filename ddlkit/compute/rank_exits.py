"""How a job's ranks ended, read back by the launcher from the exit records their rank minders left
(``.ranks/rank-N.json``, :func:`ddlkit.jobdir.rank_record`, written by :mod:`ddlkit.compute.rank_minder`
on every node into the job directory).

A failed rank makes the others fail too, later and for a reason that is not theirs: a peer is
stopped by its launcher (``mpirun``'s abort, ``srun --kill-on-bad-exit``) and checkpoints
(``EXIT_PREEMPTED``), or finds the failed rank gone (``EXIT_LOST_PEER``). What a launcher reports
for the whole job (``mpirun``'s status, the batch job's ``ExitCode``) is one of those, whichever it
happens to pick; the restart policy (:mod:`ddlkit.compute.restarts`) must judge the job by the rank
that failed *first*. A target reads it with :func:`first_failure`::

    records = read_records(job_dir)
    failure = first_failure(job_dir, world_size, records=records)
    if failure is not None:
        return JobStatus(JobState.FAILED, failure.code, f"job {id}: {failure.message()}")
    # no rank reported a failure: the launcher's own status is all there is

Records are written on the nodes' clocks; a cluster keeps them in step (NTP) far closer than the
seconds between a failure and the ends it causes. The earliest record is not always the cause: a
rank's minder may be the slower to write (a busy machine, a larger log to flush), and the peer that
found it gone records ``EXIT_LOST_PEER`` first. That peer's log names the rank it waited for
(:func:`named_peer`); when the named rank's own record shows an error of its own or a signal, it
failed first, whatever order the records came in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import RankLostError
from ..jobdir import EXIT_LOST_PEER, EXIT_OOM_KILLED, EXIT_PREEMPTED, RANKS_DIR, rank_record
from .process import OOM_KILLED, describe_exit, log_tail, quoting_tail

#: how a rank that found a peer gone says so (ddlkit.rank's RankLostError): the peer's rank, and
#: ``did not reach`` or ``stopped answering`` (it went silent) or ``left the job`` (its process ended)
_PEER_FAILED = re.compile(
    # a RunError relayed from rank 0 ("RunError: rank 0: rank 2 left the job") names the peer too
    rf"(?:{RankLostError.__name__}|RunError): (?:rank \d+: )?rank (\d+) (did not reach|stopped answering|left the job)"
)
#: how a rank ends because of another: stopped by its launcher, or finding a peer gone
_ENDED_BY_ANOTHER = (0, EXIT_LOST_PEER, EXIT_PREEMPTED)


def named_peer(tail: Sequence[str]) -> tuple[int, str] | None:
    """The rank a failed rank's log (its last lines) says it waited for, and how: ``did not reach``
    (it went silent) or ``left the job``; None when it names none."""
    named = _PEER_FAILED.search("\n".join(tail))
    return None if named is None else (int(named[1]), "left the job" if named[2] == "left the job" else "did not reach")


def read_records(job_dir: Path) -> list[dict[str, Any]]:
    """The exit records the job's ranks have left so far, in rank order (a record being replaced
    right now is left out: read again later)."""
    records = []
    for path in (Path(job_dir) / RANKS_DIR).glob(Path(rank_record("*")).name):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: r["rank"])


@dataclass(frozen=True)
class RankFailure:
    """The rank that failed first (its exit record), and what the job's other ranks did."""

    job_dir: Path
    first: dict[str, Any]
    records: list[dict[str, Any]]
    world_size: int
    #: host names by node index for messages; None: the host each record names; empty: nodes only
    #: (a cluster simulated on one machine)
    node_names: Sequence[str] | None = None

    @property
    def rank(self) -> int:
        return int(self.first["rank"])

    @property
    def oom_killed(self) -> bool:
        """Whether the kernel's out-of-memory killer ended it (its minder saw its memory cgroup count
        an OOM kill when SIGKILL ended it: ``oom_killed`` in its record)."""
        return self.first.get("oom_killed") is True

    @property
    def code(self) -> int:
        """Its exit status (minus the signal's number when a signal ended it): the job's exit code;
        :data:`~ddlkit.jobdir.EXIT_OOM_KILLED` when the out-of-memory killer ended it (never restarted)."""
        return EXIT_OOM_KILLED if self.oom_killed else int(self.first["code"])

    @property
    def log(self) -> Path:
        return self.job_dir / self.first["log"]

    @cached_property
    def tail(self) -> list[str]:
        """The last lines of its log (read once)."""
        return log_tail(self.log)

    def where(self, record: dict[str, Any] | None = None) -> str:
        """Where a rank ran (the first failure's by default): ``node 1, host gpu-07``."""
        record = self.first if record is None else record
        node = record["node"]
        if self.node_names is None:
            host = record.get("host")
        else:
            host = self.node_names[node] if 0 <= node < len(self.node_names) else None
        return f"node {node}, host {host}" if host else f"node {node}"

    def headline(self) -> str:
        if self.oom_killed:
            return f"rank {self.rank} ({self.where()}) {OOM_KILLED}"
        return f"rank {self.rank} ({self.where()}) failed first, with {describe_exit(self.code)}"

    def others(self) -> list[str]:
        """How the other ranks ended, and which never reported (killed with their rank minder)."""
        others = [
            f"rank {r['rank']}: {describe_exit(r['code'])}"
            + (" (the out-of-memory killer)" if r.get("oom_killed") is True else "")
            for r in self.records
            if r is not self.first
        ]
        missing = sorted(set(range(self.world_size)) - {r["rank"] for r in self.records})
        if missing:
            others.append(f"ranks {missing}: killed before they could report")
        return others

    def message(self, headline: str | None = None) -> str:
        """The failure for a :class:`~ddlkit.interfaces.JobStatus`: ``headline`` (default: which rank
        failed first, where, how), the last lines of its log, the others."""
        others = self.others()
        return quoting_tail(headline or self.headline(), self.log, self.tail) + (
            f"\n  then {'; '.join(others)}" if others else ""
        )


def first_failure(
    job_dir: Path,
    world_size: int,
    *,
    records: list[dict[str, Any]] | None = None,
    node_names: Sequence[str] | None = None,
) -> RankFailure | None:
    """The rank of the job in ``job_dir`` that failed first (non-zero status or a signal), from its
    ranks' exit records (``records``: as already read by :func:`read_records`); None when no rank
    reported a failure -- then the launcher's own status is all there is. ``node_names``: see
    :attr:`RankFailure.node_names`."""
    records = read_records(job_dir) if records is None else records
    failures = sorted((r for r in records if r["code"] != 0), key=lambda r: r["time"])
    if not failures:
        return None
    failure = RankFailure(Path(job_dir), failures[0], records, world_size, node_names)
    named = named_peer(failure.tail)
    if named is not None and named[0] != failure.rank:
        own = next((r for r in records if r["rank"] == named[0]), None)
        if own is not None and own["code"] not in _ENDED_BY_ANOTHER:
            # its own error or a signal from outside, recorded later: it failed first, and the job
            # ends as it did (the restart policy restarts a signal from outside, not its own error)
            return RankFailure(Path(job_dir), own, records, world_size, node_names)
    return failure
