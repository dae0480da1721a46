"""One ddlkit job is one Ray job, submitted through Ray's Jobs API (the `ray` package's
`JobSubmissionClient`): `compute.nodes` x `compute.procs_per_node`
ranks placed as a gang, the user's code shipped with the job, the files brought back when it
ends, a lost node survived by restarting the gang in place. The cluster runs the same Ray version
as the launcher, with ddlkit (and the plugins the job uses) installed; nothing else is installed
on it for a job.

    ray start --head --num-cpus=8                     # or a cluster you have: compute.address=http://<head>:8265

    ddlkit compute=ray compute.address=auto compute.nodes=2 compute.procs_per_node=4 dist=native
    ddlkit plan compute=ray compute.nodes=2 dist=native        # the submission: entrypoint, runtime env, placement
    ddlkit -m optimizer.lr=0.1,0.05,0.02,0.01 compute=ray       # one Ray job per sweep job
    ddlkit jobs status|logs|attach|cancel JOB                   # from any shell

`compute.address=auto` finds a cluster `ray start --head` started with its default temporary
directory, or the one `RAY_ADDRESS` names.

Status: works; tested on a real Ray cluster of 2-3 simulated nodes on one machine (`ray start`
on loopback).

## What is submitted

The job directory is the Ray job's `working_dir`, which Ray's client uploads: `job.json`, the
config copies, the code snapshot `code/`, and the checkpoints of an earlier run of the directory
unless the cluster still has them (below); `.ddlkit/` stays behind. The entrypoint is
`python -m ddlkit_ray.driver ray-job.json` (the driver's plan: nodes, resources, the rank command;
no secret), which runs on the head node. `compute.runtime_env` adds Ray runtime-environment
options as they are (`+compute.runtime_env.pip=[einops]`, `conda`, `py_modules`, `container`,
...); `working_dir` and `env_vars` are ddlkit's. `compute.python` names the cluster's interpreter.

Your code travels with the job: a job started from a directory that holds `my_pkg/`, with
`model.target=my_pkg.nets:build` (or `data.target`, `model.loss`, ...), ships a snapshot of that
directory, so nothing is installed on the cluster
([Your code travels with the job](../../tutorials/your-own-model.md#your-code-travels-with-the-job)).

## The gang

The driver asks for one placement group: a bundle per node of `procs_per_node` x
(`cpus_per_rank`, `gpus_per_rank`), placed over `compute.nodes` nodes by `compute.strategy`
(its default is in the options below), so the job gets all its ranks or none, `procs_per_node`
on each node. It starts one actor per rank in its node's bundle; the actors of a node copy the
job directory to the node's own disk and run the ddlkit worker there under ddlkit's rank minder
with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `DDLKIT_NODE`, ... and rank 0's node address and two
free ports of it for the rendezvous (`MASTER_ADDR`/`MASTER_PORT`, the control plane on the next
one). While the cluster is busy the driver waits, saying so, up to `compute.placement_timeout_s`,
then fails naming what it asked for and what the cluster has free.

## Output and files

Rank 0's output (and the other ranks' error lines) is the driver's output, which Ray keeps as
the job's log: `ddlkit jobs logs`/`attach` and the launcher stream it over the Jobs API's log
stream (one websocket for the job's run; its end is the job's end), and ask the job's state every
10 s (`compute.poll_interval_s` if longer) while it streams, about 10 requests to the dashboard
per job-minute. A cluster whose dashboard cannot stream (a proxy that passes no websocket) has the
whole log read every `compute.poll_interval_s` instead, which the launcher says once.

The cluster shares no disk with the launcher: every `compute.sync_interval_s` the driver copies
what the ranks wrote since its last look (checkpoints first of all), so a node that dies does not
take rank 0's checkpoints with it, and publishes rank 0's `telemetry.json` (the rank table of
`ddlkit jobs status` while the job runs). When the job ends it publishes the whole in its node's Ray log
directory, and `collect()` fetches it through the dashboard's log API (`/api/v0/logs/file`) into
the launcher's job directory: `rank-N.log`, `.ranks/`, checkpoints, metrics, the model,
`result.json`, and `.ddlkit/ray-exit.json` (how the job ended). A dashboard whose node agent does
not answer is asked again (5 tries, 1-8 s apart); if it still does not, the launcher exits with an
error naming the cause, and `ddlkit jobs attach <job dir>` brings the files later (they stay on
the cluster).

**Checkpoints stay on the cluster between runs.** Ray's Jobs API refuses a `working_dir` package
over 100 MiB, and a job directory with two ResNet-18 checkpoints (85 MiB each) is over it. So a
run that does not complete (a lost node, a preemption, a cancel) leaves its files on the driver's
node (below its Ray log directory, `ddlkit/kept/<key>`, one per job directory), and the next run
of the same job directory (a restart, or a resume days later) does not upload `checkpoints/`
again: the launcher asks that node, through the dashboard's log API, whether it still has them;
if so the driver sends them to the ranks' nodes through Ray's object store (of the rotated
checkpoints only the one the ranks resume from: the newest that matches its manifest, checked
there as the ranks will check it; the older ones stay on the driver's node until rank 0 has
written one of its own); if not (the node or the cluster was replaced) they go up with the job as
before (over 100 MiB, Ray refuses it: one line naming the limit). The files leave the cluster when
the job completes, or after 7 days without a run.

## Cancel

Ctrl-C or `ddlkit jobs cancel` is `ray job stop`, which sends SIGTERM to the driver; it passes it
to every rank, which checkpoints and exits 75, and the checkpoint comes back with `collect`. Ray
kills a driver that has not ended `compute.grace_period_s` + 60 s later (the job's
`RAY_JOB_STOP_WAIT_TIME_S`); the driver kills ranks that outlive the grace period.

## A lost node

When a node of the job dies (its raylet gone), its ranks count as killed by SIGKILL, and the
driver stops the others and collects their files. It then **restarts the gang in place**, under
ddlkit's restart policy (the launcher hands the job's `restart.*` settings and the restarts used
so far to the target), when the cluster has live nodes for the whole gang: it places the gang
again (the surviving nodes and a spare one) and starts the ranks with the files it kept, which
resume from the newest verified checkpoint, without ending the Ray job: no new submission, no new
driver, no files to the launcher and back. The console says `ddlkit: restart 1/3 in place: ...`,
the line the launcher prints for its own restarts; the launcher counts the restart against
`restart.max_restarts` and the job's record keeps it (`ddlkit jobs status`: `restarted in
place`). A detached job heals the same way, without its launcher.

When the gang does not fit (too few live nodes), the driver names the lost nodes in its exit
record and ends with status 137, and the launcher restarts the job: it submits the job again
(with the checkpoints that came back), the new gang is placed on the nodes that are left or that
joined since, and the ranks resume from the newest checkpoint. With fewer nodes up than the job
needs (`compute.min_nodes`, null: `compute.nodes`), the restart
[waits for capacity](../failures.md#waiting-for-capacity): the launcher asks the cluster's state
API every `compute.poll_interval_s` until enough nodes are up (a node that joins counts at once)
or `restart.capacity_wait_s` is over. Once submitted, the driver still waits up to
`compute.placement_timeout_s` for room on nodes that other jobs keep busy.

**Elastic world size**
([Failures, restarts and elastic jobs](../failures.md#elastic-world-size-fewer-nodes-then-all-again)):
with `compute.min_nodes` below `compute.nodes`, the restart goes on with the nodes the cluster
has -- those whose total resources hold one node of the job (`procs_per_node` x the resources per
rank), less the nodes the last run lost (Ray's GCS lists a dead raylet as alive until its health
checks have failed several times over, longer than a restart's backoff on a busy machine; the
driver saw its ranks go at once) -- at least `min_nodes`, at most `nodes`: a placement group of
that many bundles, `WORLD_SIZE` to match, and the planned world size in the job's runtime
environment for `trainer.on_resize`. A node that joins (a new raylet) counts at the next restart,
which runs on all the nodes again: a job running on fewer nodes than planned is restarted by the
launcher, never in place, so that it grows back.

    ddlkit compute=ray compute.address=auto compute.nodes=2 compute.min_nodes=1 dist=native

## Secrets

Secrets never enter the job's runtime environment (`env_vars`), which Ray writes into
`runtime_env_agent.log` on every node and shows in its dashboard and `ray job list`. They go up
with the working_dir in one file readable by the user alone, which the launcher removes once the
job is submitted, the driver once it has read it (the secrets then stay in its memory and reach
the ranks as an actor call's argument), and each rank actor on its node; no file of Ray's session
directories holds them (tested). Ray has no secret store for jobs: the uploaded package stays in
the GCS's memory while the job's record does, so keep the dashboard on a private network (it has
no authentication of its own), give jobs short-lived credentials (SAS tokens with an expiry
rather than account keys), or keep secrets on the nodes (a managed identity, a secret mounted on
every node) and out of ddlkit's config. `ddlkit plan` shows them as `***`.

## Errors

One line, exit status 2: Ray not installed here (the package to install), no cluster at
`compute.address` (the address tried), a gang the cluster cannot hold even when idle (what was
asked, per node, and what each live node has), the cluster refusing the job.

How `compute=ray` compares with a plain `ray job submit` and Ray Train's `TorchTrainer` (time to
the first step, images/sec, recovery from a lost node, requests to the dashboard) is measured by
`benchmarks/ray_target.py`: [Performance](../../explanation/performance.md#ray).

## How it works

`ddlkit_ray.target` (the launcher's side) writes `ray-job.json` (the driver's plan,
`ddlkit_ray.driver.PLAN_FILE`) into the job directory and submits the driver with the job
directory as `working_dir`, the job's environment (`spec.env`) as `env_vars`, and its secrets
(`spec.secret_env`) in `ddlkit_ray.driver.SECRETS_FILE` of the working_dir. The checkpoints an
earlier run left on the driver's node are `ddlkit_ray.driver.KEPT_DIR`, asked for through the log
API, so they do not go up and down again at every restart.

`ddlkit_ray.driver` (on the cluster) places the gang, starts one `Rank` actor per rank (which
copies the job directory to its node and runs `python -m ddlkit_ray.rank -- python -m
ddlkit.rank.worker job.json` there, under ddlkit's rank minder), passes rank 0's output to its
own, copies the ranks' new files every `sync_interval_s`, and at the end publishes them as
`ddlkit/<submission id>/files.tar` in its node's Ray log directory, with `exit.json` written last;
`collect()` fetches both through the dashboard's log API (`node_file`: an answer that is neither
the file nor "no such file" is asked again, then `NodeUnreachable`, which `collect()` turns into
an error naming `ddlkit jobs attach`). The restart policy reaches the driver with the job
(`JobSpec.restart`, in the driver's plan as `restart`); the exit record lists the restarts in
place (`restarts`), which the launcher counts and records. A job running on fewer nodes than
planned gets no restart budget, so that its next restart (the launcher's) grows it back. For an
elastic job `RayTarget.nodes_up` counts the live nodes that can hold one node of the job (Ray's
state API), less those the exit record names, and the launcher resubmits the job on that many
(`with_nodes`); the capacity wait is `ddlkit.launch.elastic.CapacityWait`.

A job's handle is the core's `SchedulerJob` over `RayScheduler`: the job's info
(`JobSubmissionClient.get_job_info`) at most once per `compute.poll_interval_s`, its log over
`tail_job_logs`; the core's `judge` decides how it ended from the ranks' exit records (`.ranks/`). Ray's Python package
is imported only when a job is submitted or followed, never when a run is composed or planned.

Tests and the benchmark start real clusters of simulated nodes on this machine with
`ddlkit_ray.testing.LocalRayCluster` (`ray start --head` and `ray start --address=...` raylets on
127.0.0.1, one CPU each, their own temporary directory and ports; a node is lost by killing its
raylet). `DDLKIT_TEST_RAY_CLUSTER=http://127.0.0.1:<port>` runs the tests that need no cluster of
their own on a cluster you started (with ddlkit importable and
`DDLKIT_PLUGINS=ddlkit.testing.fakes` in its environment). Without Ray the tests skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import queue
import re
import shlex
import shutil
import sys
import tarfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

import ddlkit
from ddlkit.atomic import replace_text, write_text
from ddlkit.compute import secret_file
from ddlkit.compute.gang import ElasticGangConfig
from ddlkit.compute.outcome import Observation
from ddlkit.compute.scheduler import Scheduler, SchedulerJob
from ddlkit.interfaces import JobHandle, JobSpec, JobState
from ddlkit.jobdir import CANCEL_FILE, CHECKPOINT_DIR, RANKS_DIR, STATE_DIR, TELEMETRY_FILE
from ddlkit.options import NON_NEGATIVE, POSITIVE, checked, one_of

from .driver import EXIT_RECORD, NOT_COLLECTED, PLAN_FILE, SECRETS_FILE, extract_files, holds, kept_name, published_name

#: the strategies a gang may be placed with (null: STRICT_SPREAD over several nodes, STRICT_PACK on one)
STRATEGIES = ("STRICT_SPREAD", "SPREAD", "STRICT_PACK", "PACK")
#: what the job manager writes into a job's log before the entrypoint's own output
_ENTRYPOINT_LINE = "Running entrypoint for job "
#: while the log streams, seconds between looks at the job's state (compute.poll_interval_s if
#: longer): the stream's end is the job's end, a look only guards against a stream that stalls
#: without closing. At poll_interval_s (2 s) the looks alone would be 30 requests a job-minute
_STREAM_LOOK_S = 10.0
#: seconds the stream gets to bring the log's last lines once the job is seen ended
_STREAM_DRAIN_S = 5.0
#: the Ray addresses whose log stream could not be opened, said once each
_NO_STREAM_SAID: set[str] = set()
_INSTALL = "pip install 'ray[default]' (the same version as the cluster's)"


@dataclass
class RayConfig(ElasticGangConfig):
    # the Ray Jobs endpoint: the head node's dashboard address, e.g. http://head:8265; auto: the
    # cluster `ray start --head` started on this machine (or the one RAY_ADDRESS names)
    address: str = "auto"
    # Ray resources per rank
    cpus_per_rank: float = checked(1.0, NON_NEGATIVE)
    gpus_per_rank: float = checked(0.0, NON_NEGATIVE)
    # the placement group's strategy; null: STRICT_SPREAD (one bundle per node) for several nodes, STRICT_PACK for one
    strategy: str | None = checked(None, one_of(STRATEGIES))
    # the interpreter of the driver and the ranks on the cluster; null: the driver runs `python`,
    # the ranks the Ray workers' own interpreter
    python: str | None = None
    # more of Ray's runtime environment, passed as it is: {pip: [...], conda: ..., py_modules: [...], ...}
    runtime_env: dict[str, Any] = field(default_factory=dict)
    # seconds the driver waits for room for the whole gang before it fails, saying what it asked for
    placement_timeout_s: float = checked(300.0, POSITIVE)
    # seconds a cancelled job's ranks get to checkpoint before they are killed
    grace_period_s: float = checked(30.0, NON_NEGATIVE)
    # seconds between the driver's copies of rank 0's new files (checkpoints: what a lost node cannot take along;
    # telemetry.json: what `ddlkit jobs status` shows of a running job)
    sync_interval_s: float = checked(10.0, POSITIVE)
    # seconds between looks at the job (each is one request to the Jobs API)
    poll_interval_s: float = checked(2.0, POSITIVE)


def _ray() -> Any:
    try:
        import ray
        from ray.job_submission import JobSubmissionClient  # noqa: F401 -- Ray's job client must import too
    except ImportError:
        raise ddlkit.ConfigError(f"compute=ray needs Ray's Python package on this machine: {_INSTALL}.") from None
    return ray


def auth_headers() -> dict[str, str]:
    """The header that carries this machine's Ray token, found where Ray's own tools look
    (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``), unless
    ``RAY_AUTH_MODE=disabled``. A head started where a token exists (any local ``ray.init()``
    writes one) refuses every request without it, and Ray's clients send it only when this process
    has ``RAY_AUTH_MODE=token``: ddlkit sends it itself, and to a cluster without token
    authentication it does no harm."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {}
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token and (path := os.environ.get("RAY_AUTH_TOKEN_PATH")):
        try:
            token = Path(path).expanduser().read_text().strip()
        except OSError as exc:
            raise ddlkit.ConfigError(
                f"RAY_AUTH_TOKEN_PATH={path}: the Ray token cannot be read ({exc.strerror}): point it at the file "
                "that holds the cluster's token, or unset it."
            ) from None
    if not token:
        with contextlib.suppress(OSError):
            token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def alive_nodes(address: str, headers: dict[str, str], *, timeout: int) -> list[Any]:
    """The live nodes of the cluster whose Jobs API is at ``address`` (Ray's state API, with
    ``headers``: the token)."""
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    state = StateApiClient(address=address, headers={"Content-Type": "application/json", **headers})
    listed: list[Any] = state.list(
        StateResource.NODES, options=ListApiOptions(timeout=timeout), raise_on_missing_output=True
    )
    return [n for n in listed if n.state == "ALIVE"]


#: seconds the Jobs API may take to accept a connection, and to answer a question (a GET) or a
#: submission (which waits for its upload): Ray's client waits for ever, so a dashboard that takes
#: connections and never answers kept the launcher silent for minutes
CONNECT_S, ANSWER_S, SUBMIT_S = 10.0, 60.0, 600.0


def client(address: str) -> Any:
    """Ray's Jobs API client for ``address``, each request bounded in time; a one-line ConfigError
    naming the address when no cluster answers there."""
    _ray()
    import requests
    from ray.job_submission import JobSubmissionClient

    # the client says each upload at INFO on the launcher's console; ddlkit says what matters itself
    for name in ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging", "ray.dashboard"):
        logging.getLogger(name).setLevel(logging.WARNING)

    class BoundedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            # the first request, the version check, gets CONNECT_S to answer: a cluster says so at once
            answer = CONNECT_S if endpoint == "/api/version" else ANSWER_S if method == "GET" else SUBMIT_S
            kwargs.setdefault("timeout", (CONNECT_S, answer))
            try:
                return super()._do_request(method, endpoint, **kwargs)
            except requests.Timeout:
                raise DashboardSilent(address, endpoint, answer) from None

    from ray.exceptions import AuthenticationError

    try:
        return BoundedClient(address, headers=auth_headers())
    except AuthenticationError as exc:
        found = "the token found here is not its token" if "invalid" in str(exc) else "none was found here"
        raise ddlkit.ConfigError(
            f"compute=ray: the Ray cluster at compute.address={address} asks for its token (Ray's token "
            f"authentication) and {found}: copy the head's ~/.ray/auth_token here, or set RAY_AUTH_TOKEN "
            "(or RAY_AUTH_TOKEN_PATH, a file holding it) in the launcher's environment."
        ) from None
    except DashboardSilent as exc:
        raise ddlkit.ConfigError(
            f"compute=ray: {exc}. Is compute.address={address} the dashboard's Jobs endpoint "
            "(http://<head>:8265), and is the head node running?"
        ) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise ddlkit.ConfigError(
            f"compute=ray cannot reach a Ray cluster at compute.address={address} ({reason}): start one (ray start "
            "--head) or give its Jobs endpoint, e.g. compute.address=http://<head>:8265."
        ) from None


class DashboardSilent(ddlkit.RunError):
    """The Jobs API took the connection and did not answer in time."""

    def __init__(self, address: str, endpoint: str, seconds: float) -> None:
        super().__init__(f"the Ray dashboard at {address} did not answer {endpoint} within {seconds:g} s")


# ---------------------------------------------------------------------------- the scheduler
class RayScheduler(Scheduler):
    """The Jobs API of the Ray cluster at ``address`` (``jobs``: its client), for ddlkit's jobs of
    ``job_dir``; a job's id is its submission id."""

    noun = "Ray job"
    #: Ray kills a stopped driver itself, grace_period_s + 60 s later (RAY_JOB_STOP_WAIT_TIME_S)
    kill_slack_s = 60.0

    def __init__(self, jobs: Any, *, address: str, job_dir: Path, poll_interval_s: float) -> None:
        self.jobs, self.address, self.job_dir = jobs, address, Path(job_dir)
        self.poll_interval_s = poll_interval_s
        self._ended: dict[str, Any] = {}  # the final job info of the jobs seen ended
        self._exit: dict[str, dict[str, Any] | None] = {}  # their drivers' exit records, once read
        self._fetched: set[tuple[str, Path]] = set()  # (job, directory) whose files were brought there
        self._streams: dict[str, _LogStream] = {}  # the log stream each job's follower has open

    # ------------------------------------------------------------ state
    def info(self, job_id: str) -> Any:
        """The Jobs API's job info (one request, until the job has ended: that info is final)."""
        if job_id in self._ended:
            return self._ended[job_id]
        try:
            info = self.jobs.get_job_info(job_id)
        except DashboardSilent as exc:
            raise ddlkit.RunError(
                f"{exc}; the job may still be running there: follow it again with `ddlkit jobs attach {self.job_dir}`"
            ) from None
        except RuntimeError as exc:
            if "does not exist" in str(exc):
                raise ddlkit.ConfigError(
                    f"the Ray cluster at {self.address} has no job {job_id} (a cluster that was restarted forgets "
                    "its jobs)."
                ) from None
            raise
        if _state(info) in _ENDED:
            self._ended[job_id] = info
        return info

    def describe(self, job_id: str) -> Observation:
        info = self.info(job_id)
        state = _state(info)
        if state == "PENDING":
            return Observation(JobState.PENDING, reason=f"Ray: PENDING ({info.message or 'waiting to start'})")
        if state not in _ENDED:
            return Observation(JobState.RUNNING, reason=f"Ray: RUNNING, driver on node {str(info.driver_node_id)[:8]}")
        try:
            record = self.exit_record(job_id) or {}
        except NodeUnreachable:  # the state stands without it; collect() says what could not be read
            record = {}
        why = f" ({record['why']})" if record.get("why") else ""
        restarts = tuple(record.get("restarts") or ())  # made in place: the launcher counts and records them
        if state == "SUCCEEDED":
            return Observation(JobState.SUCCEEDED, 0, restarts=restarts)
        if state == "STOPPED":
            return Observation(JobState.CANCELLED, record.get("code"), why and f"was cancelled{why}", restarts=restarts)
        code, message = info.driver_exit_code, info.message
        said = f" with exit status {code}{why}" if code is not None else f"{why}: {message}" if message else why
        return Observation(JobState.FAILED, code, f"failed{said}", restarts=restarts)

    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        # SIGTERM to the driver, which passes it to the ranks; Ray kills what has not ended
        # grace_period_s + 60 s later. A kill is the same request: Ray has no other. A no-op once it ended
        self.jobs.stop_job(job_id)

    # ------------------------------------------------------------ output
    def read_log(self, job_id: str, offset: int) -> str:
        return _JobOutput(offset).feed(self.jobs.get_job_logs(job_id), ended=True)

    def follow_log(self, job_id: str, offset: int, done: Callable[[], bool]) -> Iterator[str]:
        """The job's output over the log stream, for as long as the job runs (opened again after a
        drop: the dashboard restarted); a dashboard that cannot stream has the whole log read every
        ``poll_interval_s``."""
        output = _JobOutput(offset)
        while True:
            stream = self._open_stream(job_id)
            try:
                closed = yield from self._stream(stream, output, done)
            finally:
                stream.close()
                if self._streams.get(job_id) is stream:
                    del self._streams[job_id]
            if closed is None:  # it could not be opened: the log is read at the poll interval instead
                break
            if _state(self.info(job_id)) in _ENDED:  # the stream's end: the job's state, asked once
                if not closed and (text := self.read_log(job_id, output.end)):
                    yield text  # what a broken or stalled stream left out
                return
            time.sleep(self.poll_interval_s)  # it dropped while the job runs: open it again
            output = _JobOutput(output.end)
        while True:
            finished = done()
            output = _JobOutput(output.end)  # the whole log's new output (until the end, complete lines only)
            if text := output.feed(self.jobs.get_job_logs(job_id), ended=finished):
                yield text
            if finished:
                return
            time.sleep(self.poll_interval_s)

    def _open_stream(self, job_id: str) -> _LogStream:
        if (earlier := self._streams.pop(job_id, None)) is not None:
            earlier.close()  # an earlier follower left unclosed (its caller raised): one stream at a time
        self._streams[job_id] = stream = _LogStream(self.jobs, job_id)
        return stream

    def _stream(
        self, stream: _LogStream, output: _JobOutput, done: Callable[[], bool]
    ) -> Generator[str, None, bool | None]:
        """The job's new output as the stream brings it; returns True when the stream closed in
        order (the dashboard closes it after the job ended), False when it broke or stalled, None
        when it could not be opened (said once, with why)."""
        look_every = max(self.poll_interval_s, _STREAM_LOOK_S)
        next_look, drain_until = time.monotonic() + look_every, None
        got_any = False
        while True:
            wait = (drain_until if drain_until is not None else next_look) - time.monotonic()
            try:
                item = stream.chunks.get(timeout=max(0.0, wait))
            except queue.Empty:
                if drain_until is not None:
                    return False  # ended, yet the stream stays open: read the rest at once
                next_look = time.monotonic() + look_every
                if done():
                    drain_until = time.monotonic() + _STREAM_DRAIN_S
                continue
            if item is _LogStream.END:
                if text := output.feed("", ended=True):
                    yield text
                return True
            if isinstance(item, BaseException):
                if got_any:
                    return False
                if self.address not in _NO_STREAM_SAID:
                    _NO_STREAM_SAID.add(self.address)
                    reason = " ".join(str(item).split())[:200] or type(item).__name__
                    print(
                        f"ddlkit: the Ray cluster at {self.address} does not stream job logs ({reason}); reading "
                        f"the log every compute.poll_interval_s={self.poll_interval_s:g} s instead",
                        file=sys.stderr,
                        flush=True,
                    )
                return None
            got_any = True
            if text := output.feed(item, ended=False):
                yield text

    # ------------------------------------------------------------ the job's files
    def _published(self, job_id: str, what: str) -> bytes | None:
        """A file the driver published in its node's Ray log directory; None when there is none
        (:class:`NodeUnreachable` when the node could not be asked)."""
        node_id = self.info(job_id).driver_node_id
        if not node_id:
            return None
        return node_file(self.jobs, self.address, node_id, published_name(job_id, what))

    def exit_record(self, job_id: str) -> dict[str, Any] | None:
        """How the driver said the job ended (asked once the job ended); None when it said nothing
        (it was killed first, or its node was lost). Raises :class:`NodeUnreachable` when its node
        could not be asked."""
        if job_id not in self._exit:
            data = self._published(job_id, "exit.json")
            self._exit[job_id] = None
            with contextlib.suppress(ValueError):
                self._exit[job_id] = json.loads(data) if data else None
        return self._exit[job_id]

    def peek(self, job_id: str, job_dir: Path) -> None:
        """Rank 0's ``telemetry.json`` as the driver last published it (every
        ``compute.sync_interval_s``), for ``ddlkit jobs status`` of a running job; a node that does not
        answer now leaves the launcher's copy as it was."""
        if _state(self.info(job_id)) in _ENDED:
            return  # fetch brings the whole archive
        with contextlib.suppress(NodeUnreachable):
            if data := self._published(job_id, TELEMETRY_FILE):
                replace_text(Path(job_dir) / TELEMETRY_FILE, data.decode("utf-8"))

    def fetch(self, job_id: str, job_dir: Path) -> None:
        """The files the driver published (rank 0's last, checkpoints, the ranks' exit records
        ``.ranks/``), unpacked into the launcher's job directory; the job's bookkeeping there is the
        launcher's and stays. A driver that published nothing leaves nothing to fetch; a node that
        cannot be asked is an error: the job's files (its checkpoints) would silently stay behind."""
        job_dir = Path(job_dir)
        if (job_id, job_dir) in self._fetched or _state(self.info(job_id)) not in _ENDED:
            return  # the archive of an ended job does not change
        try:
            if self.exit_record(job_id) is None:  # written last: without it there is no complete archive
                return
            data = self._published(job_id, "files.tar")
        except NodeUnreachable as exc:
            raise ddlkit.RunError(
                f"Ray job {job_id} ended, but its files (results, checkpoints) could not be brought back: {exc}. "
                f"They stay on the cluster; `ddlkit jobs attach {job_dir}` brings them once the dashboard answers."
            ) from None
        if not data:
            raise ddlkit.RunError(
                f"Ray job {job_id} ended, but the archive of its files is missing from its driver's "
                f"node ({published_name(job_id, 'files.tar')} below the node's Ray log directory)"
            )
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            extract_files(tar, job_dir, skip=lambda name: name.split("/")[0] in NOT_COLLECTED and name != EXIT_RECORD)
        self._fetched.add((job_id, job_dir))


#: the Jobs API's states of a job that has ended
_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def _state(info: Any) -> str:
    return str(getattr(info.status, "value", info.status))


class _JobOutput:
    """The job's own output out of its log, fed in pieces as they come (a stream's chunks, or the
    whole log at once): what follows the job manager's line that starts the entrypoint, less Ray's
    own lines in it (when a node dies, Ray writes that raylet's state dump into the drivers'
    output). A line is judged once it is complete; ``ended`` gives the last one as it is. Every
    reading of the log starts at its start: the first ``skip`` characters of output, yielded by an
    earlier reading (a stream that dropped), are left out; :attr:`end` is where the next one starts."""

    def __init__(self, skip: int = 0) -> None:
        self.pending = ""
        self.started = False  # the job manager's entrypoint line has gone by
        self.skip, self.made = skip, 0

    @property
    def end(self) -> int:
        return max(self.skip, self.made)

    def feed(self, text: str, *, ended: bool) -> str:
        out = self._feed(text, ended)
        start, self.made = self.made, self.made + len(out)
        return out[max(0, self.skip - start) :]

    def _feed(self, text: str, ended: bool) -> str:
        self.pending += text
        if not self.started:
            head, sep, rest = self.pending.partition(_ENTRYPOINT_LINE)
            if not (sep and "\n" in rest):
                if not ended:
                    return ""
                self.pending = ""
                # a log without the entrypoint line: Ray's own message of a job that never started
                return "" if sep or "Runtime env" in head else head
            self.started, self.pending = True, rest.partition("\n")[2]
        cut = len(self.pending) if ended else self.pending.rfind("\n") + 1
        complete, self.pending = self.pending[:cut], self.pending[cut:]
        return "".join(line for line in complete.splitlines(keepends=True) if not _RAY_LINE.search(line))


class _LogStream:
    """The Jobs API's log stream of a job (``JobSubmissionClient.tail_job_logs``: one websocket;
    the log from its start, then as it grows, closed by the dashboard once the job ended), read on
    a thread of its own with its own event loop, so that the follower waits on :attr:`chunks` and
    keeps its other duties (the job's state, Ctrl-C). :attr:`chunks` brings the log's pieces, then
    :data:`END` (closed in order) or the exception that ended it; :meth:`close` ends it at once."""

    END = object()

    def __init__(self, jobs: Any, job_id: str) -> None:
        self.chunks: queue.Queue = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(self._read(jobs, job_id))
        self._thread = threading.Thread(target=self._run, name=f"ddlkit-ray-log-{job_id}", daemon=True)
        self._thread.start()

    async def _read(self, jobs: Any, job_id: str) -> None:
        async with contextlib.aclosing(jobs.tail_job_logs(job_id)) as pieces:  # closes the websocket
            async for piece in pieces:
                self.chunks.put(piece)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._task)
            self.chunks.put(self.END)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # the follower decides: read the log instead, or open it again
            self.chunks.put(exc)
        finally:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has ended already
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=5)


#: Ray's own lines in a driver's output: a dying raylet's state dump, its log lines
_RAY_LINE = re.compile(r"^\s*\[state-dump\]|^\s*\[\d{4}-\d\d-\d\d [\d:,]+ \w \d+ \d+\] \(raylet\)")


# ---------------------------------------------------------------------------- the target
class RayTarget(ddlkit.ComputeTarget):
    """``compute=ray``: a Ray job of ``nodes`` x ``procs_per_node`` ranks, placed as a gang."""

    cfg: RayConfig
    # the ranks run in copies of the job directory on the cluster's nodes
    shares_job_dir = False

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        if not str(cfg.address).strip():
            raise ddlkit.ConfigError(
                "compute.address is empty: give the Ray Jobs endpoint, e.g. "
                "compute.address=http://<head>:8265, or auto for the cluster on this machine."
            )
        for key in ("working_dir", "env_vars"):
            if key in (cfg.runtime_env or {}):
                raise ddlkit.ConfigError(
                    f"compute.runtime_env.{key} is ddlkit's to set (the job directory; the job's environment): "
                    "leave it out" + (" and put variables in the config's env instead." if key == "env_vars" else ".")
                )
        self.status_interval_s = float(cfg.poll_interval_s)
        self._jobs: Any = None

    def configure(self, config: Any) -> None:
        if config.dist.backend == "fsdp" and self.cfg.nodes > 1:
            # each rank writes its shards of a checkpoint into its own node's copy of the job
            # directory, and the driver brings back only rank 0's: no checkpoint would be whole
            raise ddlkit.ConfigError(
                f"compute=ray with compute.nodes={self.cfg.nodes} cannot train dist=fsdp: its sharded checkpoints "
                "need a job directory every node shares, and Ray's nodes each have their own copy. Use "
                "dist=native, compute.nodes=1, or a target whose nodes share a disk (compute=slurm, compute=mpi)."
            )

    @property
    def jobs(self) -> Any:
        if self._jobs is None:
            self._jobs = client(str(self.cfg.address))
        return self._jobs

    @property
    def address(self) -> str:
        """The dashboard's address the Jobs API answers on (``auto`` resolved)."""
        return str(getattr(self.jobs, "_address", self.cfg.address))

    # ------------------------------------------------------------ the request
    def driver_plan(
        self, spec: JobSpec, submission_id: str, *, key: str = "<key>", kept_on_cluster: bool = False
    ) -> dict[str, Any]:
        c = self.cfg
        return {
            "submission_id": submission_id,
            "key": key,
            "kept_on_cluster": kept_on_cluster,
            "nodes": c.nodes,
            "procs_per_node": c.procs_per_node,
            "cpus_per_rank": c.cpus_per_rank,
            "gpus_per_rank": c.gpus_per_rank,
            "strategy": c.strategy,
            "python": c.python,
            "args": list(spec.args),
            "grace_period_s": c.grace_period_s,
            "placement_timeout_s": c.placement_timeout_s,
            "sync_interval_s": c.sync_interval_s,
            # the driver restarts the gang in place under the job's restart policy (ddlkit.RestartBudget)
            "restart": asdict(spec.restart) if spec.restart is not None else None,
        }

    def entrypoint(self) -> str:
        return shlex.join([self.cfg.python or "python", "-m", "ddlkit_ray.driver", PLAN_FILE])

    def runtime_env(self, spec: JobSpec, *, kept_on_cluster: bool = False) -> dict[str, Any]:
        env_vars = {
            **spec.env,
            "PYTHONUNBUFFERED": "1",
            # how long Ray lets the stopped driver (and the ranks) checkpoint before it kills them
            "RAY_JOB_STOP_WAIT_TIME_S": str(int(self.cfg.grace_period_s + 60)),
        }
        extra = self.cfg.runtime_env or {}
        if isinstance(extra, DictConfig):  # from the command line: +compute.runtime_env.pip=[einops]
            extra = OmegaConf.to_container(extra, resolve=True)
        # the checkpoints the cluster kept do not go up again (Ray's Jobs API takes 100 MiB at most)
        excludes = [f"/{STATE_DIR}/", *([f"/{CHECKPOINT_DIR}/"] if kept_on_cluster else [])]
        return {**dict(extra), "working_dir": str(spec.job_dir), "excludes": excludes, "env_vars": env_vars}

    def placement(self) -> str:
        c = self.cfg
        strategy = c.strategy or ("STRICT_SPREAD" if c.nodes > 1 else "STRICT_PACK")
        bundle = ", ".join(f'"{k}": {v:g}' for k, v in self.node_bundle().items() if v > 0)
        return (
            f"placement group ({strategy}): {c.nodes} bundle(s) {{{bundle}}}, one per node; "
            f"{c.procs_per_node} rank actor(s) per bundle, {self.world_size} rank(s)"
        )

    def plan(self, spec: JobSpec) -> str:
        submission_id = f"{spec.name}-<id>"
        runtime_env = self.runtime_env(spec)
        secrets = (
            f"# secrets: {', '.join(sorted(spec.secret_env))}, in {SECRETS_FILE} in the working_dir (the "
            "driver reads and removes it; never in the runtime environment)"
            if spec.secret_env
            else None
        )
        return (
            "\n".join(
                filter(
                    None,
                    [
                        f"# {self.placement()}",
                        f"# {PLAN_FILE} (written into the job directory): "
                        + json.dumps(self.driver_plan(spec, submission_id)),
                        shlex.join(
                            [
                                "ray",
                                "job",
                                "submit",
                                f"--address={self.cfg.address}",
                                f"--submission-id={submission_id}",
                                f"--runtime-env-json={json.dumps(runtime_env)}",
                                "--no-wait",
                                "--",
                            ]
                        )
                        + " "
                        + self.entrypoint(),
                        secrets,
                    ],
                )
            )
            + "\n"
        )

    # ------------------------------------------------------------ checks against the cluster
    def node_bundle(self) -> dict[str, float]:
        """What one node of the gang holds: ``procs_per_node`` x the rank's resources."""
        c = self.cfg
        return {"CPU": c.cpus_per_rank * c.procs_per_node, "GPU": c.gpus_per_rank * c.procs_per_node}

    def live_nodes(self) -> tuple[list[Any], list[Any]]:
        """The cluster's live nodes, and those of them that can each hold one node's bundle of the
        job when idle (their total resources: a busy node is waited for), through Ray's state API
        at the address the Jobs client answers on."""
        need = self.node_bundle()
        nodes = alive_nodes(self.address, auth_headers(), timeout=30)
        fit = [n for n in nodes if holds(n.resources_total, need)]
        return nodes, fit

    def check_cluster(self) -> None:
        """The gang fits the cluster's nodes (what they have in all; a busy cluster is waited for)."""
        c = self.cfg
        try:
            nodes, fit = self.live_nodes()
        except Exception as exc:  # said in one line with the address
            raise ddlkit.ConfigError(
                f"compute=ray cannot list the nodes of the Ray cluster at {self.address}: "
                f"{' '.join(str(exc).split())[:300]}"
            ) from None
        if len(fit) >= c.nodes:
            return
        need = self.node_bundle()
        totals = [n.resources_total or {} for n in nodes]
        has = "; ".join(f"{t.get('CPU', 0):g} CPU, {t.get('GPU', 0):g} GPU" for t in totals) or "no live node"
        raise ddlkit.ConfigError(
            f"compute=ray: the job asks for {c.nodes} node(s) with {need['CPU']:g} CPU, {need['GPU']:g} GPU each "
            f"(compute.procs_per_node={c.procs_per_node} x cpus_per_rank={c.cpus_per_rank:g}, "
            f"gpus_per_rank={c.gpus_per_rank:g}), but the Ray cluster at {self.address} has {len(fit)} such node(s) "
            f"of {len(nodes)} ({has}): lower compute.nodes, compute.procs_per_node or the resources per rank, or add "
            "nodes to the cluster."
        )

    # ------------------------------------------------------------ elastic world size
    def nodes_up(self, spec: JobSpec) -> int | None:
        """How many nodes of the live cluster could each hold one node of the job (at most
        ``compute.nodes``), less those the job's last run lost: a killed raylet stays ALIVE in the
        GCS until its health checks have failed several times over (here: longer than a 2 s restart
        backoff), but the driver saw its ranks go at once and named their nodes in its exit record,
        which came back with the job's files (a node id is never reused: a machine that rejoins is a
        new node, and counts). None when
        the cluster does not answer (the job is then restarted on all its nodes, and the driver waits
        for them up to ``placement_timeout_s``)."""
        try:
            _, fit = self.live_nodes()
        except Exception:  # cannot tell: the launcher says so and restarts on all nodes
            return None
        lost = set(_exit_record(Path(spec.job_dir)).get("lost_nodes") or ())
        return min(sum(1 for n in fit if n.node_id not in lost), self.cfg.nodes)

    # ------------------------------------------------------------ ComputeTarget
    def submit(self, spec: JobSpec) -> JobHandle:
        jobs = self.jobs
        self.check_cluster()
        job_dir = Path(spec.job_dir).resolve()
        submission_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        # a job directory run again: the last run's cancel mark and its ranks' exit records are not this run's
        (job_dir / CANCEL_FILE).unlink(missing_ok=True)
        shutil.rmtree(job_dir / RANKS_DIR, ignore_errors=True)
        key = job_key(job_dir)
        kept = self.kept_on_cluster(job_dir, key)
        write_text(
            job_dir / PLAN_FILE,
            json.dumps(self.driver_plan(spec, submission_id, key=key, kept_on_cluster=kept), indent=2) + "\n",
        )
        secret_file.write(job_dir, spec.secret_env, SECRETS_FILE)  # for the working_dir's upload alone
        try:
            jobs.submit_job(
                entrypoint=self.entrypoint(),
                submission_id=submission_id,
                runtime_env=self.runtime_env(replace_dir(spec, job_dir), kept_on_cluster=kept),
                metadata={"ddlkit_job": spec.name},
            )
        except RuntimeError as exc:
            raise ddlkit.ConfigError(
                f"the Ray cluster at {self.address} refused the job: {' '.join(str(exc).split())[:500]}"
            ) from None
        finally:
            secret_file.remove(job_dir, SECRETS_FILE)
        return self._job(submission_id, job_dir)

    def kept_on_cluster(self, job_dir: Path, key: str) -> bool:
        """Whether the node that ran the job's last driver still keeps that run's files (their
        mark answers through the log API: the node is alive and its log directory has them)."""
        kept = _exit_record(job_dir).get("kept") or {}
        if kept.get("key") != key or not kept.get("node_id"):
            return False
        try:
            return node_file(self.jobs, self.address, kept["node_id"], kept_name(key)) is not None
        except NodeUnreachable as exc:
            print(f"ddlkit: {exc}; the job's checkpoints go up with it from {job_dir}", file=sys.stderr, flush=True)
            return False

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        return self._job(str(job_id), Path(job_dir).resolve(), ask=True)

    def _job(self, job_id: str, job_dir: Path, *, ask: bool = False) -> SchedulerJob:
        c = self.cfg
        scheduler = RayScheduler(self.jobs, address=self.address, job_dir=job_dir, poll_interval_s=c.poll_interval_s)
        if ask:
            scheduler.info(job_id)  # a job the cluster does not know is said now, in one line
        return SchedulerJob(
            scheduler,
            job_id,
            job_dir=job_dir,
            world_size=self.world_size,
            poll_interval_s=c.poll_interval_s,
            grace_period_s=c.grace_period_s,
        )


class NodeUnreachable(Exception):
    """The dashboard's log API did not answer for a node, try after try (a busy dashboard or node
    agent, a dropped connection): whether the file is there is not known."""


#: what the log API answers when the node has no such file, and when the cluster has no such node
#: (any other answer that is not the file is a failure to ask)
_NO_FILE, _NO_NODE = "A file is not found at", "doesn't exist"


def node_file(jobs: Any, address: str, node_id: str, filename: str, *, tries: int = 5) -> bytes | None:
    """A file below a node's Ray log directory, through the dashboard's log API (``GET
    /api/v0/logs/file``, what ``ray logs`` uses); None when there is none (or no such live node).
    An answer that is neither is asked again, ``tries`` times 1, 2, 4, ... s apart, then raises
    :class:`NodeUnreachable`; so is "no such node", then taken as such (a node just joined is
    not known to the dashboard at once)."""
    import requests

    query = urllib.parse.urlencode({"node_id": node_id, "filename": filename, "lines": -1, "timeout": 120})
    why = ""
    for attempt in range(tries):
        if attempt:
            time.sleep(2 ** (attempt - 1))
        try:
            reply = requests.get(
                f"{address}/api/v0/logs/file?{query}", timeout=300, headers=getattr(jobs, "_headers", None) or {}
            )
        except requests.RequestException as exc:
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            continue
        if reply.status_code == 200:
            return reply.content
        if _NO_FILE in reply.text:
            return None
        if _NO_NODE in reply.text and attempt == tries - 1:
            return None
        why = f"HTTP {reply.status_code}: {' '.join(reply.text.split())[:200]}"
    raise NodeUnreachable(
        f"the Ray dashboard at {address} did not read {filename} on node {node_id[:8]} ({tries} tries): {why}"
    )


def job_key(job_dir: Path) -> str:
    """The job directory's name on the cluster, the same for every run of the job (restarts, a
    resume after a cancel): where the driver keeps the files of a run that did not complete."""
    path = job_dir / KEY_FILE
    if not path.is_file():
        write_text(path, uuid.uuid4().hex + "\n")
    return path.read_text(encoding="utf-8").strip()


#: the job directory's key (:func:`job_key`), in its bookkeeping (which never goes to the cluster)
KEY_FILE = f"{STATE_DIR}/ray-key"


def _exit_record(job_dir: Path) -> dict[str, Any]:
    """How the job's last run ended, as its driver said (:data:`~ddlkit_ray.driver.EXIT_RECORD`,
    collected into the job directory); empty when there is none."""
    try:
        return json.loads((job_dir / EXIT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def replace_dir(spec: JobSpec, job_dir: Path) -> JobSpec:
    from dataclasses import replace

    return replace(spec, job_dir=job_dir)
