"""Registers ``compute=slurm``. Hook implementations only: nothing heavy at import."""

from __future__ import annotations

import ddlkit

from .target import SlurmConfig, SlurmTarget


@ddlkit.hookimpl
def ddlkit_compute_targets():
    yield ddlkit.Registration("slurm", SlurmTarget, config=SlurmConfig,
                              description="one Slurm batch job (sbatch) per ddlkit job, nodes x procs_per_node ranks "
                                          "started by srun; checkpoints and re-queues itself before its time limit")
