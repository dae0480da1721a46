"""compute=local_mpi (several simulated nodes on this machine) and compute=mpi (real hosts),
both started by OpenMPI's mpirun.

Kept empty: every rank imports this package through ``python -m ddlkit_mpi.rank`` before its
worker starts, so it must cost nothing.
"""
