"""The SDK for compute-target plugins: what a target that starts ddlkit's ranks may build on.

* :mod:`ddlkit.compute.rank_minder`: the program a target starts once per rank, around the ddlkit
  worker (logs, console, exit records, signals, no orphans); the target adds only how a rank
  learns its place in the job.
"""
