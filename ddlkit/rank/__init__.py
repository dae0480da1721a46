"""The rank's wing: what runs in every rank of a job, from its job directory, never re-entering
Hydra.

``python -m ddlkit.rank.worker job.json`` (:mod:`.worker`) rebuilds the typed config, joins the
other ranks (:mod:`.distributed`: rank discovery, the control plane, :class:`DistContext`) and
hands the :class:`~ddlkit.rank.run.Run` (schedule, throughput, monitors, checkpoints,
``result.json``) to the framework. It stands beside the launcher's wing (:mod:`ddlkit.launch`) on
the shared base and imports nothing from it.
"""
