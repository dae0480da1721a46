"""``ddlkit jobs``: find submitted jobs again, on any compute target, from any shell.

    ddlkit jobs list [--all]             recent jobs: name, target, state, submitted, job directory
    ddlkit jobs status JOB               state, exit code, explanation, result
    ddlkit jobs logs JOB [--follow]      rank 0's output (until the job ends, with --follow)
    ddlkit jobs attach JOB               follow as if never detached; Ctrl-C detaches again
    ddlkit jobs cancel JOB               ask the job to checkpoint and stop; wait until it has

JOB is a job's name (or a unique prefix of it) or its job directory. The job's compute target
is rebuilt from the job's own ``job.json`` and re-attached with the id recorded at submission;
a job whose end is recorded is answered from its directory, without its target
(:class:`~ddlkit.launch.index.EndedJob`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ...errors import ConfigError, DdlkitError, exit_code_for
from ...interfaces import JobHandle, JobStatus
from ...jobdir import JOB_FILE, RESULT_FILE, TELEMETRY_FILE
from ...result import STATUS
from .. import index


def _handle(sub: index.Submission) -> JobHandle:
    from ...plugins import installed_registry

    return sub.handle(installed_registry())


def _elsewhere(sub: index.Submission, handle: JobHandle) -> bool:
    """Whether the job's processes run on another machine (compute=local or local_mpi, submitted
    there): only that machine's processes tell its state, this host can say nothing of it."""
    from ...compute.process import ProcessJob

    return isinstance(handle, ProcessJob) and bool(sub.host) and sub.host != socket.gethostname()


def _resume_hint(job_dir: Path) -> str:
    overrides = json.loads((job_dir / JOB_FILE).read_text(encoding="utf-8")).get("overrides", [])
    kept = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    return f"resume with: ddlkit {shlex.join([*kept, f'hydra.run.dir={job_dir}'])}"


def _ago(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _live_status(sub: index.Submission) -> tuple[JobStatus | None, str]:
    """The target's answer for a job not yet recorded as ended, or None and why it cannot be asked."""
    try:
        handle = _handle(sub)
        if _elsewhere(sub, handle):
            return None, f"it runs on host {sub.host}: ask there"
        return handle.status(), ""
    except DdlkitError as err:
        return None, str(err)


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    entries = index.recent(None if args.all else 20)
    if not entries:
        out.write(f"ddlkit: no jobs recorded yet (in {index.state_dir()}).\n")
        return 0
    rows = [("JOB", "TARGET", "STATE", "SUBMITTED", "JOB DIR")]
    unknown = []  # (job, why its state is not known now): after the table, on stderr, so the table stays a table
    for entry in entries:
        state = "?"
        try:
            sub = index.load(Path(entry["job_dir"]))
            state = sub.state
            if not sub.ended:
                status, why = _live_status(sub)
                state = status.state.value if status else f"{sub.state}?"
                if status is None:
                    unknown.append((entry["name"], f"{sub.state} when last recorded; not known now: {why}"))
        except DdlkitError as err:
            state = "gone"
            unknown.append((entry["name"], str(err)))
        rows.append((entry["name"], entry.get("target", "?"), state, _ago(entry.get("submitted", 0)), entry["job_dir"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4] + "\n")
    out.flush()
    for name, why in unknown:
        print(f"ddlkit: {name}: {why}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    sub = index.find(args.job)
    handle = _handle(sub)
    if _elsewhere(sub, handle):
        out.write(
            f"job:       {sub.name}\n"
            f"state:     unknown from this host: it runs as process {sub.id} on host {sub.host}; ask there\n"
            f"submitted: {_ago(sub.submitted)} on {sub.host}\n"
            f"job dir:   {sub.job_dir}\n"
        )
        return 0
    status = handle.status()
    out.write(
        f"job:       {sub.name}\n"
        f"target:    compute={sub.target}, id {sub.id}\n"
        f"state:     {status.state.value}"
        + (f" (exit status {status.exit_code})" if status.exit_code not in (None, 0) else "")
        + "\n"
        f"submitted: {_ago(sub.submitted)} on {sub.host or '?'}\n"
        f"job dir:   {sub.job_dir}\n"
    )
    for number, restart in enumerate(sub.restarts, 1):
        out.write(_restart_line(number, restart) + "\n")
    if sub.sweep_decision:
        out.write(f"sweep:     {sub.sweep_decision}\n")
    if status.message:
        out.write(status.message.rstrip() + "\n")
    if not status.state.done:
        with contextlib.suppress(DdlkitError):  # the ranks' view is a bonus: the state above is the answer
            handle.peek()
    out.write(_ranks_view(Path(sub.job_dir), running=not status.state.done))
    result = Path(sub.job_dir) / RESULT_FILE
    if status.state.done and result.is_file():
        data = json.loads(result.read_text(encoding="utf-8"))
        shown = {f.name: data.get(f.name) for f in STATUS if f.name in data}
        out.write(f"result:    {json.dumps(shown)}\n")
        for s in data.get("stragglers") or ():
            until = f"to step {s['until']}" if s.get("until") is not None else "to the end"
            out.write(
                f"straggler: rank {s['rank']} (node {s['node']}) from step {s['since']} {until}, up to "
                f"{s['slower_pct']:.0f} % slower than the others: {s['phase']} {s['phase_share']:.0%} of its time\n"
            )
    return 0


def _ranks_view(job_dir: Path, *, running: bool) -> str:
    """The ranks' step telemetry as rank 0 last wrote it (every trainer.log_every steps): each rank's
    images/sec, its data wait and its wait for the others as shares of its step time, stragglers marked."""
    try:
        view = json.loads((job_dir / TELEMETRY_FILE).read_text(encoding="utf-8"))
        rows, named = view["ranks"], set(view.get("stragglers") or ())
    except (OSError, ValueError, KeyError, TypeError):
        return ""  # one rank, a target whose ranks write elsewhere, or no logging step yet
    age = f" (written {_ago(view['time'])})" if running and view.get("time") else ""
    header = "  rank  node  host              img/s  data wait  sync wait"
    lines = [f"ranks:     at step {view.get('step')}{age}", header]
    for r in rows:
        mark = "  <- straggler" if r["rank"] in named else ""
        lines.append(
            f"  {r['rank']:>4}  {r['node']:>4}  {str(r['host'])[:16]:<16} {r['images_per_sec']:>6.1f}  "
            f"{r['data_wait']:>9.0%}  {r['sync_wait']:>9.0%}{mark}"
        )
    return "\n".join(lines) + "\n"


def _restart_line(number: int, restart: dict[str, Any]) -> str:
    """One restart of the job's record: when, why, the run that ended (the target's id) and what it cost."""
    reached = restart.get("step_reached")
    at = f"at step {reached}" if reached is not None else "before its first step"
    ended = f" as {restart['ended_id']}" if restart.get("ended_id") else ""
    lost = restart.get("steps_lost", 0)
    # an elastic job's restart: on how many of its nodes, and what that did to the batch (ddlkit.launch.elastic)
    where = f" on {restart['nodes']} of {restart['planned_nodes']} nodes" if restart.get("planned_nodes") else ""
    resize = f"; {restart['resize']}" if restart.get("resize") else ""
    # a restart that waited for its nodes (ddlkit.launch.elastic.CapacityWait)
    if (waited := restart.get("waited_for_capacity_s")) is not None:
        where += f" after waiting {waited:.0f} s for capacity"
    # restarted where it ran by its target (a Ray job's driver), or submitted again by the launcher
    how = "restarted in place" if restart.get("in_place") else "resubmitted"
    return (
        f"restart {number}: {_ago(restart.get('time', 0))}: {restart.get('cause')}; it ended {at}{ended} "
        f"({restart.get('detail')}); {how}{where}, resuming from step {restart.get('resumed_from')} "
        f"({lost} step{'' if lost == 1 else 's'} lost){resize}"
    )


def cmd_logs(args: argparse.Namespace, out: TextIO) -> int:
    handle = _handle(index.find(args.job))
    try:
        for chunk in handle.logs(follow=args.follow):
            out.write(chunk)
            out.flush()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_attach(args: argparse.Namespace, out: TextIO) -> int:
    from .. import follow

    sub = index.find(args.job)
    handle = _handle(sub)
    if sub.ended is not None:
        out.write(f"ddlkit: job {sub.name} has ended ({sub.state}); rank 0's output:\n")
    else:
        out.write(
            f"ddlkit: attached to job {sub.name} (compute={sub.target}, id {sub.id}); Ctrl-C detaches, "
            f"`ddlkit jobs cancel {sub.name}` stops it\n"
        )
    out.flush()
    status = follow.follow(handle, out=out, progress_bar=out.isatty(), on_interrupt="detach")
    if status is None:
        out.write(f"\nddlkit: detached; job {sub.name} runs on. Attach again: ddlkit jobs attach {sub.name}\n")
        return 0
    follow.conclude(
        handle, status, job_dir=Path(sub.job_dir), name=sub.name, resume_hint=_resume_hint(Path(sub.job_dir)), out=out
    )
    return 0


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    from .. import follow

    sub = index.find(args.job)
    handle = _handle(sub)
    if _elsewhere(sub, handle):
        raise ConfigError(
            f"job {sub.name} runs as process {sub.id} on host {sub.host}: its state is unknown from "
            f"this host; cancel it there (ddlkit jobs cancel {sub.name})."
        )
    status = handle.status()
    if status.state.done:
        out.write(f"ddlkit: job {sub.name} already ended ({status.state.value}); nothing to cancel.\n")
        return 0
    out.write(f"ddlkit: asking job {sub.name} to checkpoint and stop...\n")
    out.flush()
    handle.cancel()
    status = handle.wait()
    handle.collect()
    sub.ended_with(status)
    out.write(
        f"ddlkit: job {sub.name} {status.state.value}"
        + (f" (exit status {status.exit_code})" if status.exit_code is not None else "")
        + (
            f"; {_resume_hint(Path(sub.job_dir))}\n"
            if follow.resumable(status, Path(sub.job_dir))
            else "; it left no checkpoint: nothing to resume\n"
        )
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddlkit jobs", description="Find submitted jobs again, on any target.")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="recent jobs")
    ls.add_argument("--all", action="store_true", help="every recorded job, not only the 20 most recent")
    for name, text in (
        ("status", "a job's state"),
        ("attach", "follow a job; Ctrl-C detaches"),
        ("cancel", "checkpoint and stop a job"),
    ):
        sub.add_parser(name, help=text).add_argument("job", help="job name (or prefix) or job directory")
    lg = sub.add_parser("logs", help="rank 0's output")
    lg.add_argument("job", help="job name (or prefix) or job directory")
    lg.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    return parser


COMMANDS = {"list": cmd_list, "status": cmd_status, "logs": cmd_logs, "attach": cmd_attach, "cancel": cmd_cancel}


def main(argv: list[str], out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args, out or sys.stdout)
    except DdlkitError as err:
        print(f"ddlkit: error: {err}", file=sys.stderr)
        return exit_code_for(err)
