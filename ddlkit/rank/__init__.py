"""The rank's wing: what runs in every rank of a job, from its job directory, never re-entering
Hydra.

``python -m ddlkit.rank.worker job.json`` (:mod:`.worker`) rebuilds the typed config, joins the
other ranks (:mod:`.distributed`: rank discovery, the control plane, :class:`DistContext`) and
hands the :class:`~ddlkit.rank.run.Run` (schedule, throughput, monitors) to the framework; the
run hands on its epoch loop (:mod:`.loop`), its checkpoint files (:mod:`.checkpointing`),
stopping on SIGTERM (:mod:`.preemption`), ``result.json`` (:mod:`.results`) and its start-up
phases (:mod:`.phases`). It stands beside the launcher's wing (:mod:`ddlkit.launch`) on
the shared base and imports nothing from it.
"""
