"""The launcher's wing: everything that runs where ``ddlkit`` is typed, never on a rank.

The command line and its Hydra app (:mod:`.cli`); a run's way from config to end: its checks
(:mod:`.validate`), its job directory written (:mod:`.prepare`), submitted, followed and
collected (:mod:`.follow`); the commands a launcher prints (:mod:`.commandline`), ``ddlkit jobs``
(:mod:`.jobs`), sweeps and ``ddlkit plan`` (:mod:`.sweep`), ``ddlkit data`` and ``ddlkit compute
down``. It stands beside the rank's wing (:mod:`ddlkit.rank`) on the shared base -- interfaces,
registry, plugins, config schemas and the job directory's protocol (:mod:`ddlkit.jobdir`) -- and
imports nothing from the rank's wing.
"""
