"""compute=slurm: a ddlkit job as a Slurm batch job, its ranks started by srun.

Kept empty: every rank imports this package through ``python -m ddlkit_slurm.rank`` before its
worker starts, so it must cost nothing.
"""
