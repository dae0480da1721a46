"""What every process of a ``compute=azureml`` job runs: ``python -m ddlkit_azure.rank -- COMMAND...``,
in the job's directory (its output ``job_dir``, which the service keeps in the workspace).

It runs COMMAND (the ddlkit worker) under ddlkit's rank minder (:mod:`ddlkit.compute.rank_minder`:
``rank-N.log``, rank 0's output on the process's own -- the Azure ML log the launcher follows --,
the exit record ``.ranks/rank-N.json`` from which the launcher judges how the job ended once it has
downloaded the output, the service's SIGTERM passed on as the worker's one stop request, no
orphans). What is Azure ML's own:

* **rank layout**, as the ranks read it without a minder: ``MpiDistribution``'s OpenMPI variables
  (``OMPI_COMM_WORLD_*``; the node from the rank and the local size), ``PyTorchDistribution``'s
  ``RANK`` and ``LOCAL_RANK`` (the command exports ``DDLKIT_NODE`` and ``DDLKIT_LOCAL_SIZE``), or one
  process;
* **a record of its own**: the output outlives a job (a preempted job queued again, the same job
  directory run again), so the rank's record of an earlier run goes before the worker starts, and
  rank 0 removes those of ranks the job does not have;
* **the job's secrets**: read from the job's Key Vault (:mod:`ddlkit_azure.keyvault`: the job's
  environment names the vault and the secrets, never a value) with the job's identity, into the
  worker's environment only, as ``secret_file`` gives them on the other targets. A vault that
  refuses or lacks a secret is one line (the vault, the secret, the role to grant) and exit status 2.

Standard library, :mod:`ddlkit.compute.rank_minder` and :mod:`~ddlkit.compute.layout` only, unless
the job has secrets (then ``azure-keyvault-secrets`` and ``azure-identity``): it starts once per
rank before the worker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ddlkit.compute import rank_minder as minder
from ddlkit.compute.layout import LOCAL_RANK_ENV, LOCAL_SIZE_ENV, NODE_ENV
from ddlkit.jobdir import RANKS_DIR, rank_record

from . import keyvault


def _pick(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    return default


def layout(env: Mapping[str, str]) -> tuple[int, int, dict[str, str]]:
    """(rank, world size, the node layout's variables) of this process."""
    rank = _pick(env, "OMPI_COMM_WORLD_RANK", "RANK", default=0)
    world = _pick(env, "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
    local_rank = _pick(env, LOCAL_RANK_ENV, "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", default=0)
    local_size = _pick(env, LOCAL_SIZE_ENV, "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=1)
    # Azure ML places process_count_per_instance ranks on each node, node after node
    node = _pick(env, NODE_ENV, "GROUP_RANK", default=rank // max(local_size, 1))
    return rank, world, {NODE_ENV: str(node), LOCAL_RANK_ENV: str(local_rank), LOCAL_SIZE_ENV: str(local_size)}


def forget_earlier_records(rank: int, world: int, job_dir: Path) -> None:
    """The records an earlier run left in the output: this rank's, and (rank 0) those of ranks
    beyond this job's."""
    for path in (job_dir / RANKS_DIR).glob(Path(rank_record("*")).name):
        number = path.stem.removeprefix("rank-")
        if number == str(rank) or rank == 0 and number.isdigit() and int(number) >= world:
            path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    minder.forward_signals()  # first of all: a stop request while this rank starts must not kill it
    command = minder.entry_command(sys.argv[1:] if argv is None else argv, "ddlkit_azure.rank")
    if command is None:
        return 2
    rank, world, variables = layout(os.environ)
    forget_earlier_records(rank, world, Path.cwd())
    try:
        variables |= keyvault.read(os.environ)
    except keyvault.SecretsError as err:
        print(f"ddlkit_azure: rank {rank}: {err}", file=sys.stderr, flush=True)
        return 2
    return minder.run(command, rank=rank, variables=variables, name="ddlkit_azure")


if __name__ == "__main__":
    sys.exit(main())
