"""The SDK for compute-target plugins: what a target that starts ddlkit's ranks may build on.

* :mod:`ddlkit.compute.scheduler`: the adapter a target implements for its scheduler (``Scheduler``:
  describe, signal, read_log, fetch) and the one handle the core keeps over any (``SchedulerJob``:
  paced asking, the cancel protocol, the final status);
* :mod:`ddlkit.compute.outcome`: how a job ended, one rule for every target (``judge`` over what the
  scheduler says, an ``Observation``, and the ranks' exit records);
* :mod:`ddlkit.compute.gang`: the schema base of a target whose job is ``nodes`` nodes of
  ``procs_per_node`` ranks (``GangConfig``; ``ElasticGangConfig`` adds ``min_nodes``), from which
  ``ComputeTarget.world_size``, ``nodes`` and ``min_nodes`` come;
* :mod:`ddlkit.compute.process`: jobs whose processes run on this machine -- :class:`ProcessJob`
  (a command under a minder in a session of its own: follow, judge, cancel and detach it from its
  id and directory; override ``final_status`` for a launcher such as ``mpirun``), and the helpers
  for targets that follow a job elsewhere: ``LogFollower`` (streams a growing log), ``log_tail``,
  ``kill_session``, ``describe_exit``, ``processes``;
* :mod:`ddlkit.compute.rank_minder`: the program a target starts once per rank, around the ddlkit
  worker (logs, console, exit records, signals, no orphans); the target adds only how a rank
  learns its place in the job;
* :mod:`ddlkit.compute.rank_exits`: the ranks' exit records read back (``first_failure``: the rank
  that failed first, whatever ``mpirun`` or ``srun`` reports), which ``judge`` rules by;
* :mod:`ddlkit.compute.containers`: ddlkit's container images for targets that run the ranks in a
  container: their names (``default_image``), their build context for a service that builds images
  itself (``image_context``), and whether a registry has one (``check_image``, ``ensure_pullable``);
* :mod:`ddlkit.compute.ports`: free ports for rank 0's rendezvous, chosen below the kernel's
  ephemeral range (``free_ports``), so that no connection is handed them before rank 0 listens;
* :mod:`ddlkit.compute.state`: ddlkit's state directory on the launcher's machine, where a target
  keeps what it must remember between launches;
* :mod:`ddlkit.compute.resume`: for a target that copies a job directory to its nodes, which files a
  run that resumes leaves out (``files_to_leave``: the checkpoints older than the one it resumes from);
* :mod:`ddlkit.compute.restarts`: the restart policy (``classify``: whose failure ended a job;
  ``RestartPolicy``), which the launcher applies, and a target that restarts a job's ranks in place
  applies alike (``RestartPolicy.from_budget`` with :attr:`ddlkit.JobSpec.restart`).

The job directory's layout, exit codes and environment names are :mod:`ddlkit.jobdir`; plan
output hides secrets with :mod:`ddlkit.redact`; data staging is :mod:`ddlkit.storage`.
This package's ``__init__`` imports nothing, and ``import ddlkit`` loads its names lazily: a rank
entry imports the rank minder, once per rank, with nothing of the training stack.
"""
