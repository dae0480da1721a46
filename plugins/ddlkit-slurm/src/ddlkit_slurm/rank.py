"""What ``srun`` starts for every task of a ``compute=slurm`` job:
``python -m ddlkit_slurm.rank -- COMMAND...``, in the job directory.

It runs COMMAND (the ddlkit worker) under ddlkit's rank minder
(:mod:`ddlkit.compute.rank_minder`: ``rank-N.log``, the exit record ``.ranks/rank-N.json``,
signals, no orphans). The console is this process's output, which srun writes to the batch job's
output (``slurm.log``), the file the launcher follows: rank 0's output, the other ranks' error
lines, and a failing rank's last lines, each prefixed ``[rank N]`` -- the launcher reads nothing
else. What is Slurm's own:

* **rank layout**: Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``
  and ``SLURM_STEP_TASKS_PER_NODE`` become what :class:`ddlkit.DistContext` and torch.distributed
  read (:class:`ddlkit.compute.layout.RankLayout`).

* **secrets**: the job's secret environment, from :mod:`ddlkit.compute.secret_file` (sbatch's
  environment, which Slurm keeps in its spool, never holds them).

Standard library, :mod:`ddlkit.compute.rank_minder` and :mod:`~ddlkit.compute.secret_file` only: it
starts once per rank before the worker.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ddlkit.compute import rank_minder as minder
from ddlkit.compute import secret_file
from ddlkit.compute.layout import RankLayout

#: how many of a failed rank's last lines reach slurm.log (the handle's message quotes its end)
TAIL_LINES = 15


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed task counts, ``"4(x2),2"`` -> ``[4, 4, 2]``."""
    sizes: list[int] = []
    for part in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"cannot read tasks per node {spec!r}")
        sizes += [int(m.group(1))] * int(m.group(2) or 1)
    return sizes


def layout(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The ranks' variables from Slurm's (a task of ``srun``)."""
    rank, world = int(env["SLURM_PROCID"]), int(env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or 1)
    local_rank, node = int(env.get("SLURM_LOCALID", 0)), int(env.get("SLURM_NODEID", 0))
    try:
        local_size = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""))[node]
    except (ValueError, IndexError):
        local_size = int(env.get("SLURM_NTASKS_PER_NODE") or 1)
    return RankLayout(rank, world, local_rank, local_size, node).to_env()


def main(argv: list[str] | None = None) -> int:
    minder.forward_signals()  # first of all: a stop request while this rank starts must not kill it
    command = minder.entry_command(sys.argv[1:] if argv is None else argv, "ddlkit_slurm.rank")
    if command is None:
        return 2
    variables = layout(os.environ)
    # the job's secrets come in a file of the job directory, not in sbatch's environment (ddlkit.compute.secret_file)
    variables |= secret_file.read(Path.cwd())
    return minder.run(
        command, rank=int(variables["RANK"]), variables=variables, name="ddlkit_slurm", tail_lines=TAIL_LINES
    )


if __name__ == "__main__":
    sys.exit(main())
