"""A job's ranks in miniature, for tests of how a job ended (:func:`ddlkit.compute.outcome.judge`):
:func:`rank_exit` runs a snippet of Python as one rank under the real rank minder
(:mod:`ddlkit.compute.rank_minder`), which leaves the rank's log and exit record in the job
directory exactly as it does on a cluster's node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..compute.layout import LOCAL_RANK_ENV, LOCAL_SIZE_ENV, NODE_ENV

__all__ = ["LOST_PEER", "rank_command", "rank_exit"]

#: a rank's end as ddlkit's worker says it after finding rank ``{peer}`` gone (``EXIT_LOST_PEER``)
LOST_PEER = (
    "import sys; print('ddlkit worker (rank {rank}): RankLostError: rank {peer} {how} during `allreduce_mean`', "
    "file=sys.stderr); sys.exit(76)"
)

#: a target's rank entry: forward signals, then run the rank under the minder as ``argv[1]`` says
_ENTRY = """
import json, sys
from ddlkit.compute import rank_minder as minder
minder.forward_signals()
sys.exit(minder.run(sys.argv[2:], **json.loads(sys.argv[1])))
"""


def rank_command(rank: int, code: str, *, node: int | None = None) -> list[str]:
    """The command that runs ``code`` (Python, unbuffered) as rank ``rank`` (on node ``node``, default
    the rank's own) under the rank minder, in the job directory that is its working directory."""
    layout = {NODE_ENV: str(rank if node is None else node), LOCAL_RANK_ENV: "0", LOCAL_SIZE_ENV: "1"}
    options = {"rank": rank, "variables": layout, "name": "test"}
    return [sys.executable, "-c", _ENTRY, json.dumps(options), sys.executable, "-u", "-c", code]


def rank_exit(job_dir: Path, rank: int, code: str, *, node: int | None = None, timeout: float = 60) -> int:
    """Run ``code`` as rank ``rank`` of a job in ``job_dir`` (:func:`rank_command`) to its end;
    returns the minder's exit status once the rank's exit record is written."""
    job_dir = Path(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    command = rank_command(rank, code, node=node)
    return subprocess.run(command, cwd=job_dir, capture_output=True, timeout=timeout).returncode
