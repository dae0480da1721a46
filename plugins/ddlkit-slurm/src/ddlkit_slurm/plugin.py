"""Registers ``compute=slurm``. Hook implementations only: nothing heavy at import."""

from __future__ import annotations

import ddlkit


@ddlkit.hookimpl
def ddlkit_compute_targets():
    yield ddlkit.Registration(
        "slurm",
        "ddlkit_slurm.target:SlurmTarget",
        config="ddlkit_slurm.target:SlurmConfig",
        description="one Slurm batch job (sbatch) per ddlkit job, nodes x procs_per_node ranks "
        "started by srun; checkpoints and re-queues itself before its time limit",
    )
