"""The job directory: what lives in it, who writes it, and when. The protocol's reference.

A job *is* its directory (see :mod:`ddlkit.interfaces.compute`): the launcher writes it, a compute
target makes it available where the ranks run (the same directory on a shared disk, or a copy),
the ranks write their output into it, and the target brings that back. Every name below is the
one place its file is spelled; plugins and shell scripts rendered by compute targets use these
constants, never the literals. Paths are relative to the job directory, with ``/`` separators
(they go into shell scripts and remote file shares as they are)::

    <job_dir>/
      job.json            JOB_FILE          launcher, before submit: the resolved config (secrets
                                            redacted) every rank runs from (WORKER_ARGS)
      config.yaml         CONFIG_FILE       launcher, before submit: the same config, for people
      overrides.yaml      OVERRIDES_FILE    launcher, before submit: the command-line overrides
      environment.json    ENVIRONMENT_FILE  launcher, before submit: versions, host, git commit
      rank-N.log          rank_log(N)       the target (its rank minder), while the job runs:
                                            rank N's output
      .ranks/             RANKS_DIR         the target's rank minders (ddlkit.compute.rank_minder)
        rank-N.json       rank_record(N)    rank N's minder, when the rank ended: how and when
                                            (the launcher names the rank that failed first); the
                                            target removes them before it runs the job again
      metrics.jsonl       METRICS_FILE      rank 0 (logger=jsonl), while the job runs
      checkpoints/                          rank 0, while the job runs (ddlkit.checkpoint)
      result.json         RESULT_FILE       rank 0, once, when training completed; its absence
                                            after the job ended means the job failed
      .ddlkit/            STATE_DIR         bookkeeping, never results; a target that copies the
                                            job directory elsewhere leaves it behind
        lock              LOCK_FILE         rank 0, while it runs: two runs of one job directory
                                            would destroy each other's checkpoints
        submission.json   SUBMISSION_FILE   launcher, at submit and when the job ends
                                            (ddlkit.launch.index: how ``ddlkit jobs`` finds it)
        cancel-requested  CANCEL_FILE       whoever cancels the job (``JobHandle.cancel``), before
                                            signalling it: the job's end is then a cancellation
        exit.json         EXIT_FILE         the process minder of a job run on this machine
                                            (ddlkit.compute.process), when the job's command ended
        detached          DETACHED_FILE     ``ProcessJob.detach``: the job outlives its launcher
        <target>-*        the target's own  e.g. compute=slurm's ``.ddlkit/slurm-exit.json``

Exit status of every rank (``python -m ddlkit.rank.worker job.json``): :data:`EXIT_COMPLETED`,
:data:`EXIT_FAILED` (anything else), :data:`EXIT_CONFIG_ERROR` (the user's fix),
:data:`EXIT_PLUGIN_ERROR` (the plugin author's fix), and :data:`EXIT_PREEMPTED`: stopped on SIGTERM
after saving a resumable checkpoint -- a scheduler may re-queue the job, a re-run of the same job
directory resumes it.

Environment a job's ranks get from the launcher beyond the compute target's own: in a sweep,
:data:`SWEEP_NAME_ENV` and :data:`SWEEP_JOB_ENV` (loggers group a sweep's runs by them).

Results are published in the order of :data:`RESULT_FILES`, ``result.json`` last: a result.json
at the destination means everything before it arrived.

This module imports nothing, so that a process that must start in milliseconds can load it by its
file path without importing the ``ddlkit`` package (the rank minder does, once per rank).
"""

#: the resolved job file every rank reads
JOB_FILE = "job.json"
#: what each rank runs after the interpreter, in the job directory
WORKER_ARGS = ("-m", "ddlkit.rank.worker", JOB_FILE)
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
ENVIRONMENT_FILE = "environment.json"
#: where rank 0 writes the checkpoints (``ddlkit.checkpoint``: their layout and verification)
CHECKPOINT_DIR = "checkpoints"
#: the researcher's own code, for ranks that do not see the launcher's disk: a snapshot of the
#: launch directory (``ddlkit.compute.snapshot``), first on the ranks' import path
CODE_DIR = "code"
#: what the snapshot holds: its files and sizes, and its content digest
CODE_FILE = "code.json"


#: rank 0's progress line in its log: the console logger writes it, the launcher draws it as a bar
PROGRESS_LINE = "train epoch {epoch}/{epochs} step {step}/{total} loss {loss} lr {lr} {unit}/s {ips} eta {eta}"
#: :data:`PROGRESS_LINE` as a regular expression, one named group per field (compile it where it is read)
PROGRESS_PATTERN = (
    r"^train epoch (?P<epoch>\d+)/(?P<epochs>\d+) step (?P<step>\d+)/(?P<total>\d+) "
    r"loss (?P<loss>\S+) lr (?P<lr>\S+) (?P<unit>img|samples)/s (?P<ips>\S+) eta (?P<eta>\S+)$"
)


def rank_log(rank: int | str) -> str:
    """Rank ``rank``'s output (``rank-0.log`` is what the launcher follows; ``"*"`` gives the glob)."""
    return f"rank-{rank}.log"


#: the rank minders' exit records, one per rank (see :func:`rank_record`)
RANKS_DIR = ".ranks"


def rank_record(rank: int | str) -> str:
    """How and when rank ``rank`` ended (JSON, written by its minder once; ``"*"`` gives the glob)."""
    return f"{RANKS_DIR}/rank-{rank}.json"


#: written by the jsonl logger (its default ``logger.jsonl.filename``)
METRICS_FILE = "metrics.jsonl"
#: written by rank 0 when training completed, and only then (its fields: :mod:`ddlkit.result`)
RESULT_FILE = "result.json"
#: rank 0's latest view of the ranks' step telemetry (ddlkit.rank.telemetry), which `ddlkit jobs status` shows
TELEMETRY_FILE = "telemetry.json"
#: the job's files that are its results, in the order they are published: result.json last
RESULT_FILES = (CONFIG_FILE, OVERRIDES_FILE, ENVIRONMENT_FILE, METRICS_FILE, RESULT_FILE)
#: what a storage that publishes a job's whole output adds to RESULT_FILES (checkpoints aside)
OUTPUT_GLOBS = (JOB_FILE, "staging*.json", "model.*", rank_log("*"))

#: ddlkit's bookkeeping inside a directory (a job's; a staged dataset copy's): never a result
STATE_DIR = ".ddlkit"
LOCK_FILE = f"{STATE_DIR}/lock"
SUBMISSION_FILE = f"{STATE_DIR}/submission.json"
CANCEL_FILE = f"{STATE_DIR}/cancel-requested"
EXIT_FILE = f"{STATE_DIR}/exit.json"
DETACHED_FILE = f"{STATE_DIR}/detached"

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_CONFIG_ERROR = 2
EXIT_PLUGIN_ERROR = 3
#: stopped on SIGTERM after writing a resumable checkpoint (EX_TEMPFAIL: try again later)
EXIT_PREEMPTED = 75
#: stopped because another rank was lost: it left, went silent past ``dist.timeout_s``, or never
#: joined. The infrastructure's failure, not this rank's (a restart policy restarts such a job)
EXIT_LOST_PEER = 76

#: not a rank's own status: the job's when a rank was killed by the kernel's out-of-memory killer (its
#: minder saw its memory cgroup count an OOM kill: ``"oom_killed": true`` in its exit record), as
#: ddlkit.compute.outcome.judge rules. The job's own, never restarted: the same job would meet it again
EXIT_OOM_KILLED = 77

#: a node is down while its scratch directory holds this file: how compute=local_mpi simulates a lost
#: node that does not come back (the fake framework's kill_node writes it; removing it brings the node back)
NODE_DOWN = "down"

#: set in the ranks' environment when the launcher restarted the job after an infrastructure
#: failure: how many times so far, and how many optimizer steps those failures cost in all
RESTARTS_ENV = "DDLKIT_RESTARTS"
STEPS_LOST_ENV = "DDLKIT_STEPS_LOST"

#: set in the environment of every job of a sweep: the sweep's name (loggers group runs by it, e.g.
#: W&B's ``group``) and the job's number
SWEEP_NAME_ENV = "DDLKIT_SWEEP_NAME"
SWEEP_JOB_ENV = "DDLKIT_SWEEP_JOB"
