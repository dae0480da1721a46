"""Multirun sweeps: ``ddlkit -m`` runs every combination of the swept values as its own job.

* :mod:`.launch` - the launcher behind ``hydra/launcher=ddlkit`` (its docstring holds the design);
* :mod:`.jobs` - ddlkit's own sweeps: validate all, submit to the compute target, ledger, report;
* :mod:`.scheduler` - keeps ``max_parallel`` jobs in flight through the JobHandle contract;
* :mod:`.forked` - a plain Hydra task's job as a forked child process;
* :mod:`.ledger`, :mod:`.report`, :mod:`.settings`, :mod:`.compose`.

``ddlkit plan -m ...`` is this launcher with ``dry_run`` set (:func:`ddlkit.launch.cli.plan_main`).

Nothing here is imported by a single run; the CLI imports :mod:`.jobs` only to mark its task.
"""
