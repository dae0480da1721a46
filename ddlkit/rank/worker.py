"""The rank side: ``python -m ddlkit.rank.worker job.json``, in the job directory.

Every rank of every compute target runs this on the same resolved job file. The job directory
is the one that holds the job file, wherever it was copied or mounted: the file names no path
of the launcher's. It never re-enters Hydra; it loads plugins (entry points, as the launcher
did), learns its rank from the environment, decides whether to resume from the checkpoints it
finds in its job directory, and hands over to the ``ddlkit_run_loop`` hook.

Exit status: :data:`~ddlkit.jobdir.EXIT_COMPLETED`; ``EXIT_PREEMPTED``, stopped on SIGTERM after a
resumable checkpoint; ``EXIT_CONFIG_ERROR``; ``EXIT_PLUGIN_ERROR``; ``EXIT_LOST_PEER``, stopped because
another rank was lost (ddlkit's collectives say so; a framework's error while another rank's process
ended is taken for its consequence); ``EXIT_FAILED``, anything else.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TextIO

from ..atomic import LockHeld, hold_lock
from ..checkpoint import resolve_resume
from ..compute import secret_env
from ..config import rebuild
from ..custom import LAUNCH_DIR_ENV
from ..errors import ConfigError, DdlkitError, RankLostError, RunError, exit_code_for
from ..jobdir import CODE_DIR, EXIT_COMPLETED, EXIT_CONFIG_ERROR, EXIT_FAILED, EXIT_LOST_PEER, EXIT_PREEMPTED, LOCK_FILE
from ..plugins import get_plugin_manager
from ..redact import scrub
from ..registry import Registry
from .distributed import DistContext
from .phases import RECORDED, record_phase, report_phase
from .preemption import Preempted, stop_at_once
from .run import Run

#: seconds a rank whose framework failed waits to learn whether another rank's process ended: the
#: framework's error about a dead peer can come before the control connection's end is read
LOST_PEER_GRACE_S = 1.0


def load_job(job_file: Path) -> dict:
    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    secret_env.restore(job["config"], secret_env.decode(os.environ.get(secret_env.SECRETS_ENV)))
    return job


def main(argv: list[str] | None = None) -> int:
    RECORDED.clear()  # a run in a process that ran one before (a test, a notebook) records its own
    record_phase("worker started")  # the interpreter and ddlkit's core imported
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ddlkit.rank.worker JOBFILE", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        job = load_job(Path(argv[0]))
    except (OSError, ValueError, KeyError) as err:
        # the compute target did not make the job directory available where this rank runs
        print(
            f"ddlkit worker: cannot read the job file {Path(argv[0]).resolve()} ({err}); a compute target "
            "runs every rank in (a copy of) the job directory",
            file=sys.stderr,
        )
        return EXIT_CONFIG_ERROR
    secrets = secret_env.decode(os.environ.get(secret_env.SECRETS_ENV))
    job_dir = Path(argv[0]).resolve().parent
    user_code_on_path(job_dir)
    # the rank's place in the job comes first (every error below is reported with it), before the
    # plugins that rebuild() needs are loaded: the core's own dist settings, as the job file states them
    d = job["config"]["dist"]
    dist = DistContext.from_env(d["backend"], timeout_s=d["timeout_s"], warn_after_s=d["warn_after_s"])
    run: Run | None = None
    status = "failed"
    #: every rank ends here at the same step (completed, or stopped by the ranks' agreement)
    ended_together = False
    try:
        signal.signal(signal.SIGTERM, stop_at_once)  # until the run's own handler replaces it
        # the ranks of one job share its job file: its name (unique per job directory) tells them
        # apart from the ranks of any other job that might reach the same port
        dist.connect(job_id=str(job.get("name")))
        if d.get("hang_stacks", True):
            dist.write_stacks_on_hang(job_dir)
        if dist.world_size > 1:
            report_phase(dist, f"{dist.world_size} ranks connected", "ranks connected")
        record_phase("ranks connected")  # one rank: connected to no one, at once
        if dist.rank == 0:
            lock = hold_job_directory(job_dir)  # noqa: F841 -- held until this process exits
        pm = get_plugin_manager()
        registry = Registry.collect(pm)
        record_phase("plugins loaded")
        # a rank runs inside its compute target and never builds it: an image or a cluster's nodes need not
        # have the target's plugin installed (a third-party target's image need not carry it)
        cfg = rebuild(job["config"], registry, as_given=("compute",))
        run = Run(
            cfg,
            job_dir,
            pm=pm,
            registry=registry,
            dist=dist,
            resume_from=resolve_resume(job_dir, cfg.trainer.resume),
            name=job.get("name"),
        )
        dist.track_step(lambda: run.state.step, lambda: run.telemetry.where)
        run.install_signal_handlers()
        if dist.is_main and (checked := run.storage.check_access(run.name)):
            print(f"ddlkit: {checked}", flush=True)
        run.framework.check_environment(cfg)  # what this image or node lacks, before anything starts
        pm.hook.ddlkit_run_loop(run=run)
        status, ended_together = "completed", True
        return EXIT_COMPLETED
    except Preempted as stop:
        status, ended_together = "interrupted", True
        saved = "checkpoint saved, resumable" if stop.checkpointed else "nothing to checkpoint yet, resumable"
        print(f"ddlkit worker (rank {dist.rank}): {stop}; {saved}", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        status = "interrupted"
        return 130
    except DdlkitError as err:
        print(
            f"ddlkit worker (rank {dist.rank}): {type(err).__name__}: {scrub(str(err), secrets)}",
            file=sys.stderr,
        )
        _name_silent_ranks(dist, err)
        return exit_code_for(err)
    except Exception as err:
        # a bug in a plugin or a framework failure: the full trace belongs in the rank log
        print(scrub(traceback.format_exc(), secrets), file=sys.stderr)
        if lost := dist.lost_ranks(wait_s=LOST_PEER_GRACE_S):
            # the framework's collective failed because a rank died (gloo: "Connection closed by
            # peer", naming no rank): the infrastructure's failure, which the restart policy restarts
            print(
                f"ddlkit worker (rank {dist.rank}): {RankLostError.__name__}: rank {lost[0]} left the job (its "
                f"process ended) while this rank trained: the error above is the consequence",
                file=sys.stderr,
            )
            return EXIT_LOST_PEER
        if _name_silent_ranks(dist, err):
            # a collective that timed out waiting for a stopped or hung rank: the infrastructure's failure
            # too, which the restart policy restarts; the silent rank is named as the one that failed first
            return EXIT_LOST_PEER
        return EXIT_FAILED
    finally:
        finish_code = _finish(run, status, dist.rank, secrets) if run is not None else EXIT_COMPLETED
        _leave(dist, ended_together and not finish_code)
        sys.stdout.flush()
        sys.stderr.flush()
        if finish_code:
            # results could not be kept (e.g. uploads failed after their retries): that outranks
            # the training outcome, so it replaces the pending return value
            sys.exit(finish_code)


def user_code_on_path(job_dir: Path) -> None:
    """Put the researcher's code first on the import path, for this rank and the processes it starts
    (data-loading workers): the job's code snapshot (``code/``, shipped by a launcher on another
    disk), or the launch directory on a shared disk (``$DDLKIT_LAUNCH_DIR``)."""
    if (job_dir / CODE_DIR).is_dir():
        os.environ[LAUNCH_DIR_ENV] = str(job_dir / CODE_DIR)
    where = os.environ.get(LAUNCH_DIR_ENV)
    if where and where not in sys.path:
        sys.path.insert(0, where)


def hold_job_directory(job_dir: Path) -> TextIO:
    """Lock the job directory for this job's rank 0, or raise ConfigError naming the process that
    holds it: two jobs writing checkpoints into one directory would destroy each other's. The
    lock is the kernel's (``lockf``, which NFS shares too), so it is released on any exit, SIGKILL
    included; the returned file keeps it while it is open."""
    try:
        return hold_lock(job_dir / LOCK_FILE)
    except LockHeld as holder:
        raise ConfigError(
            f"{job_dir} is in use by another run of a job ({holder}): wait for it, stop it "
            f"(`ddlkit jobs cancel {job_dir}`), or run in another directory."
        ) from None


def _name_silent_ranks(dist: DistContext, err: BaseException) -> bool:
    """After a failure, name the ranks that had stopped answering, last, as a lost peer
    (``RankLostError: rank N stopped answering ...``, which the launcher's judge reads): a framework's
    collective that timed out waiting for a stopped rank names none, and the launcher's report
    quotes the end of the log of the rank that failed first, a live one (#17). Whether any was silent."""
    if isinstance(err, RunError) and err.component == "dist":
        return False  # the control plane's own errors say it already
    silent = dist.silent_ranks()
    for said in silent:
        print(
            f"ddlkit worker (rank {dist.rank}): {RankLostError.__name__}: {said}: this rank's collectives were "
            "waiting for it, which is the likely cause of the error above",
            file=sys.stderr,
        )
    return bool(silent)


def _finish(run: Run, status: str, rank: int, secrets: dict[str, str]) -> int:
    """End the run (result.json, publishing, loggers); a DdlkitError becomes one clean line."""
    try:
        run.finish(status)
        return EXIT_COMPLETED
    except DdlkitError as err:
        print(
            f"ddlkit worker (rank {rank}): {type(err).__name__}: {scrub(str(err), secrets)}",
            file=sys.stderr,
        )
        return exit_code_for(err)


def _leave(dist: DistContext, ended_together: bool) -> None:
    """Leave the job together after a clean end. An MPI launcher stops the whole job as soon
    as one rank exits with a non-zero status (EXIT_PREEMPTED after a preemption), so no rank may exit before
    rank 0 has finished its checkpoint, result.json and loggers. After a failure a rank leaves
    at once: its closed connection is how the others learn of it."""
    if ended_together and dist.world_size > 1:
        try:
            dist.barrier()
        except DdlkitError as err:
            print(f"ddlkit worker (rank {dist.rank}): {err}", file=sys.stderr)
    dist.close()


def run_process() -> None:
    """``python -m ddlkit.rank.worker``: run, then leave without the interpreter's teardown.

    Everything a job keeps is written and closed by then (checkpoints, result.json, loggers,
    uploads). What remains is freeing the interpreter: with PyTorch or TensorFlow loaded that
    takes one to two seconds per job, which a sweep of short jobs pays for every job and a
    launcher waits out before it can start the next. The atexit handlers still run (they end
    data-loader workers and logger services); only the finalisation of modules is skipped."""
    try:
        code = main()
    except SystemExit as stop:
        code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    run_process()
