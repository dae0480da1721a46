"""ddlkit.rank.distributed: where a rank learns its place, and the framework-neutral collectives
(metric means, the stop agreement, broadcasts, barriers) over real processes and sockets."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import queue
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ddlkit
from ddlkit.horovod import horovod_built_with
from ddlkit.rank.distributed import DistContext, control_address
from ddlkit.testing import hold, wait_for


# ---------------------------------------------------------------------------- environment
def test_the_launchers_node_layout_wins_over_the_hosts() -> None:
    # local_mpi on one host: OpenMPI says local rank 3 of 4, the simulated layout says node 1, local rank 1
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "DDLKIT_NODE": "1",
        "DDLKIT_LOCAL_RANK": "1",
        "DDLKIT_LOCAL_SIZE": "2",
        "DDLKIT_NODE_SCRATCH": "/scratch/node-1",
    }
    ctx = DistContext.from_env("native", env, timeout_s=9.0)
    assert (ctx.rank, ctx.world_size, ctx.node, ctx.local_rank, ctx.local_size) == (3, 4, 1, 1, 2)
    assert ctx.node_scratch == "/scratch/node-1" and ctx.timeout_s == 9.0
    assert not ctx.is_local_main


def test_the_node_index_follows_from_rank_and_local_size_under_plain_mpi() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_COMM_WORLD_NODE_RANK": "2",
    }
    assert DistContext.from_env(env=env).node == 1


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"DDLKIT_CONTROL_ADDR": "10.0.0.4:7000", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, ("10.0.0.4", 7000)),
        ({"DDLKIT_CONTROL_ADDR": "[::1]:7000"}, ("::1", 7000)),
        ({"MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}, ("node-0", 29501)),
    ],
)
def test_control_address(env: dict[str, str], expected: tuple[str, int]) -> None:
    assert control_address(env) == expected


def test_several_ranks_without_a_rendezvous_address_is_a_config_error() -> None:
    with pytest.raises(ddlkit.ConfigError, match="MASTER_ADDR and MASTER_PORT"):
        DistContext(0, 2).connect("job", env={})
    with pytest.raises(ddlkit.ConfigError, match="host:port"):
        control_address({"DDLKIT_CONTROL_ADDR": "nohost"})


def test_one_process_needs_no_connection_and_collectives_are_identities() -> None:
    ctx = DistContext()
    ctx.connect("job", env={})  # no address needed
    assert ctx.allreduce([1, 2], "max") == [1.0, 2.0]
    assert ctx.allreduce_mean({"a": 3}) == {"a": 3.0}
    assert ctx.any(True) is True and ctx.any(False) is False
    assert ctx.broadcast({"x": 1}) == {"x": 1} and ctx.allgather("me") == ["me"]
    ctx.barrier()


def test_horovod_built_with_looks_for_a_bindings_extension(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.machinery
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert horovod_built_with("torch/mpi_lib_v2") is None  # not installed
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "mpi_lib_v2.cpython-312-x86_64-linux-gnu.so").touch()
    spec = importlib.machinery.ModuleSpec("horovod", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "horovod" else None)
    assert horovod_built_with("torch/mpi_lib_v2") is True
    assert horovod_built_with("tensorflow/mpi_lib") is False


# ---------------------------------------------------------------------------- real processes
@dataclass(frozen=True)
class Plane:
    """The ranks' dist settings, and where their warnings go."""

    timeout_s: float = 20.0
    warn_after_s: float = 60.0
    #: each rank's stderr goes to rank-N.err in this directory (None: the test's own)
    stderr_dir: Path | None = None


def _rank_main(
    rank: int, world: int, port: int, job: str, body: Callable[[DistContext], Any], results: Any, plane: Plane
) -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "DDLKIT_CONTROL_ADDR": f"127.0.0.1:{port}",
    }
    if plane.stderr_dir is not None:
        sys.stderr = open(plane.stderr_dir / f"rank-{rank}.err", "w", encoding="utf-8")  # closed as the process ends
    ctx = DistContext.from_env("native", env, timeout_s=plane.timeout_s, warn_after_s=plane.warn_after_s)
    try:
        ctx.connect(job, env=env)
        results.put((rank, "ok", body(ctx)))
    except ddlkit.DdlkitError as err:
        results.put((rank, "error", f"{type(err).__name__}: {err}"))
    finally:
        ctx.close()


def start_ranks(
    world: int, body: Callable[[DistContext], Any], job: str = "job", plane: Plane = Plane()
) -> tuple[list[Any], Any]:
    """``world`` ranks in processes of their own, each running ``body``: (processes, answers)."""
    from ddlkit.compute.ports import free_ports

    ctx = mp.get_context("fork")
    results = ctx.Queue()
    (port,) = free_ports(1)
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, job, body, results, plane)) for r in range(world)]
    for p in procs:
        p.start()
    return procs, results


def collect(
    procs: list[Any], results: Any, timeout: float = 30.0, ranks: Iterable[int] | None = None
) -> dict[int, tuple[str, Any]]:
    """The answers of ``ranks`` (default: all), then every rank ended (killed if it must be)."""
    waiting = set(range(len(procs)) if ranks is None else ranks)
    out = {}
    deadline = time.monotonic() + timeout
    # until those ranks have answered, or the ones that have not are dead (and their answers read)
    while waiting - set(out) and time.monotonic() < deadline:
        running = any(procs[r].is_alive() for r in waiting)
        try:
            # a rank that has ended may have put its answer a moment before: its queue's feeder thread
            # delivers it later on a loaded machine, so a look after the ends waits longer
            rank, kind, value = results.get(timeout=0.1 if running else 5.0)
        except queue.Empty:
            if not running:
                break
            continue
        out[rank] = (kind, value)
    for p in procs:
        if _stopped(p.pid):
            p.kill()
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return out


def run_ranks(
    world: int, body: Callable[[DistContext], Any], timeout: float = 30.0, job: str = "job", plane: Plane = Plane()
) -> dict[int, tuple[str, Any]]:
    return collect(*start_ranks(world, body, job, plane), timeout=timeout)


def _text(path: Path) -> str:
    """What a rank has written to ``path`` so far."""
    return path.read_text() if path.exists() else ""


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _collectives(ctx: DistContext) -> dict[str, Any]:
    r = ctx.rank
    return {
        "sum": ctx.allreduce([r, 1.0], "sum"),
        "max": ctx.allreduce([r], "max"),
        "mean": ctx.allreduce_mean({"loss": float(r), "top1": 0.5 * r}),
        "any_one": ctx.any(r == 2),
        "any_none": ctx.any(False),
        "bcast": ctx.broadcast({"from": r}, root=1),
        "gather": ctx.allgather(f"host-{r}"),
        "barrier": ctx.barrier(),
    }


@pytest.mark.slow
def test_every_rank_gets_the_same_answers() -> None:
    out = run_ranks(3, _collectives)
    assert {kind for kind, _ in out.values()} == {"ok"}, out
    expected = {
        "sum": [3.0, 3.0],
        "max": [2.0],
        "mean": {"loss": 1.0, "top1": 0.5},
        "any_one": True,
        "any_none": False,
        "bcast": {"from": 1},
        "gather": ["host-0", "host-1", "host-2"],
        "barrier": None,
    }
    assert [value for _, value in out.values()] == [expected] * 3


def _mismatch(ctx: DistContext) -> None:
    ctx.barrier() if ctx.rank == 1 else ctx.any(False)


@pytest.mark.slow
def test_ranks_calling_different_collectives_fail_loudly_instead_of_mixing_data() -> None:
    out = run_ranks(3, _mismatch)
    assert all(kind == "error" and "ranks disagree" in value for kind, value in out.values()), out


def _one_rank_dies(ctx: DistContext) -> float:
    ctx.barrier()
    if ctx.rank == 2:
        os._exit(9)  # dies without a word, as under kill -9
    t0 = time.monotonic()
    try:
        ctx.any(False)
    finally:
        # the survivors report how long they waited: the dist timeout is 20 s
        print(f"rank {ctx.rank} noticed after {time.monotonic() - t0:.3f} s", flush=True)
    return -1.0


@pytest.mark.slow
def test_a_dead_rank_is_noticed_at_once_not_after_the_timeout() -> None:
    t0 = time.monotonic()
    out = run_ranks(3, _one_rank_dies)
    assert time.monotonic() - t0 < 10
    assert set(out) == {0, 1}, out
    assert out[0][0] == "error" and "rank 2 left the job" in out[0][1]
    # rank 1 learns it from rank 0, which tells everyone why before it gives up
    assert out[1][0] == "error" and "rank 2 left the job" in out[1][1]


def _strangers_knock(ctx: DistContext) -> list[str]:
    return ctx.allgather(str(ctx.rank))


@pytest.mark.slow
def test_a_rank_of_another_job_cannot_join() -> None:
    import socket

    from ddlkit.compute.ports import free_ports

    # rank 0 of job A listens; a rank of job B knocks first, then job A's rank 1 joins
    (port,) = free_ports(1)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    a0 = ctx.Process(target=_rank_main, args=(0, 2, port, "job-A", _strangers_knock, results, Plane()))
    a0.start()

    def knock() -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:  # not listening yet
            return None

    stranger = wait_for(knock, "rank 0 of job A to listen", timeout=10, pace=0.02)
    from ddlkit.rank.control_plane import ControlPlane

    ControlPlane._send(stranger, {"rank": 1, "world_size": 2, "job": "job-B"})
    a1 = ctx.Process(target=_rank_main, args=(1, 2, port, "job-A", _strangers_knock, results, Plane()))
    a1.start()
    got = dict(results.get(timeout=20)[::2] for _ in range(2))
    a0.join(5), a1.join(5)
    stranger.close()
    assert got == {0: ["0", "1"], 1: ["0", "1"]}


def _connected_to_itself() -> Any:
    """A TCP socket connected to itself, as the kernel makes one when a dial to a port of the ephemeral
    range that nothing listens on picks that port as its source (simultaneous open)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.connect(sock.getsockname())
    assert sock.getsockname() == sock.getpeername()
    return sock


def test_a_rank_whose_dial_connects_to_itself_dials_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 dials rank 0's control port before rank 0 listens; the kernel may connect the socket
    to itself, and rank 1 read its own hello as rank 0's answer (a KeyError seen on a Ray cluster):
    such a connection counts as refused, and the dial goes on to the real rank 0."""
    import socket

    from ddlkit.rank.control_plane import ControlPlane

    listener = socket.create_server(("127.0.0.1", 0))
    real_dial, dials = socket.create_connection, []

    def first_to_itself(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        dials.append(address)
        return _connected_to_itself() if len(dials) == 1 else real_dial(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", first_to_itself)
    sock = ControlPlane._dial(listener.getsockname(), time.monotonic() + 10, rank=1)
    with sock, listener:
        assert sock.getpeername() == listener.getsockname() and len(dials) == 2


def test_an_answer_that_is_not_rank_0s_is_a_clear_error() -> None:
    from ddlkit.errors import RunError
    from ddlkit.rank.control_plane import ControlPlane

    sock = _connected_to_itself()
    ControlPlane._send(sock, {"rank": 1, "world_size": 2, "job": "job-A"})  # ControlPlane.connect's hello
    plane = ControlPlane(1, 2, {0: sock}, timeout_s=5)  # rank 1 hears its own messages
    try:
        with pytest.raises(RunError, match=r"rank 1 expected rank 0's answer to `hello` #1 but got .*'job': 'job-A'"):
            plane.exchange("hello", {"rank": 1}, lambda values: None)
    finally:
        plane.close()


def _time_stop_checks(ctx: DistContext) -> float:
    n = 2000
    ctx.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        ctx.any(False)
    return (time.perf_counter() - t0) / n


@pytest.mark.slow
def test_the_per_step_stop_agreement_is_cheap() -> None:
    out = run_ranks(2, _time_stop_checks)
    seconds = max(value for _, value in out.values())
    # measured ~0.1 ms on 2 busy cores; a training step takes 10-1000x longer
    assert seconds < 0.005, f"one stop check took {seconds * 1e3:.2f} ms"


# ---------------------------------------------------------------------------- a rank that stops answering
STOPPED_AT = 12  # the step the stopped rank reports


def _rank_1_stops(ctx: DistContext) -> None:
    """After a barrier, rank 1 stops as under SIGSTOP (all its threads: no more heartbeats)."""
    ctx.track_step(lambda: STOPPED_AT)
    ctx.barrier()
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)


def _waits_for_rank_1(ctx: DistContext) -> bool:
    _rank_1_stops(ctx)
    answer = ctx.any(False)
    if ctx.rank == 0:
        # rank 1 was resumed: until rank 0's heartbeat thread has said so, both stay in the job
        # (of a rank that has left, nobody says that it answers again)
        own_stderr = Path(sys.stderr.name)
        wait_for(lambda: "is answering again" in own_stderr.read_text(), "rank 0 to hear rank 1 again", timeout=10)
    ctx.barrier()
    return answer


@pytest.mark.slow
def test_a_stopped_rank_is_reported_while_waiting_and_named_when_the_wait_fails(tmp_path: Path) -> None:
    plane = Plane(timeout_s=6.0, warn_after_s=1.0, stderr_dir=tmp_path)
    out = collect(*start_ranks(2, _waits_for_rank_1, plane=plane), ranks=[0])
    kind, error = out[0]
    assert kind == "error"
    assert re.fullmatch(
        rf"RankLostError: rank 1 did not reach `any` within 6 s \(dist.timeout_s\): rank 1 stopped "
        rf"answering at step {STOPPED_AT}, [6-9] s ago \(its process is stopped or hung, or its "
        r"host or the network is\)",
        error,
    ), error
    warnings = (tmp_path / "rank-0.err").read_text().splitlines()
    # once per dist.warn_after_s of silence, while rank 0 waits
    assert warnings[0] == (
        f"ddlkit: rank 1 has not been heard from for 1 s (last at step {STOPPED_AT}): stopped or "
        "hung? The job waits for it up to dist.timeout_s=6 s"
    )
    assert [int(w.split(" for ")[1].split(" s ")[0]) for w in warnings] == list(range(1, len(warnings) + 1))
    assert len(warnings) >= 4


def _waits_without_a_timeout(ctx: DistContext) -> None:
    _rank_1_stops(ctx)
    time.sleep(60)  # as in Horovod's all-reduce, which has no timeout of its own


@pytest.mark.slow
def test_a_rank_that_stays_silent_past_the_timeout_ends_a_wait_that_has_none(tmp_path: Path) -> None:
    procs, results = start_ranks(
        2, _waits_without_a_timeout, plane=Plane(timeout_s=3.0, warn_after_s=1.0, stderr_dir=tmp_path)
    )
    t0 = time.monotonic()
    procs[0].join(timeout=30)
    took = time.monotonic() - t0
    collect(procs, results, ranks=[])
    assert procs[0].exitcode == 1
    assert took < 15, f"rank 0 waited {took:.1f} s for a rank silent for dist.timeout_s=3 s"
    last = (tmp_path / "rank-0.err").read_text().splitlines()[-1]
    assert re.fullmatch(
        rf"ddlkit worker \(rank 0\): RunError: rank 1 stopped answering at step {STOPPED_AT}, [4-6] s "
        r"ago \(its process is stopped or hung, or its host or the network is\); the job has waited "
        r"for it longer than dist.timeout_s=3 s: this rank ends the job",
        last,
    ), last


def _rank_1_is_busy(ctx: DistContext) -> list[str]:
    ctx.barrier()
    if ctx.rank == 1:
        # 4 x dist.warn_after_s of pure Python, which holds the GIL but lets the heartbeats through
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            sum(range(1000))
    ctx.barrier()
    return ctx.silent_ranks()


@pytest.mark.slow
def test_a_slow_rank_that_is_alive_is_not_reported(tmp_path: Path) -> None:
    out = run_ranks(2, _rank_1_is_busy, plane=Plane(warn_after_s=1.0, stderr_dir=tmp_path))
    assert out == {0: ("ok", []), 1: ("ok", [])}
    assert (tmp_path / "rank-0.err").read_text() == ""


@pytest.mark.slow
def test_a_pause_shorter_than_the_timeout_is_reported_and_then_forgiven(tmp_path: Path) -> None:
    procs, results = start_ranks(
        2, _waits_for_rank_1, plane=Plane(timeout_s=20.0, warn_after_s=1.0, stderr_dir=tmp_path)
    )
    log = tmp_path / "rank-0.err"
    wait_for(lambda: "has not been heard from for 2 s" in _text(log), "rank 0 to report the stopped rank", timeout=20)
    os.kill(procs[1].pid, signal.SIGCONT)
    assert collect(procs, results) == {0: ("ok", False), 1: ("ok", False)}
    lines = log.read_text().splitlines()
    assert re.fullmatch(r"ddlkit: rank 1 is answering again, after [2-5] s of silence", lines[-1]), lines


def _rank_2_stops(ctx: DistContext, rank_1_heard: Path) -> tuple[list[str], float]:
    """What ranks 0 and 1 say of rank 2, which stops after a barrier, and how long after it they say it."""
    ctx.track_step(lambda: 5)
    ctx.barrier()
    passed = time.monotonic()
    if ctx.rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    silent = wait_for(ctx.silent_ranks, "rank 2 to be named silent", timeout=20)
    waited = time.monotonic() - passed
    if ctx.rank == 1:
        rank_1_heard.touch()
    else:
        # rank 0 names rank 2 from its own clock, before its next heartbeat tells rank 1: were it to end
        # now, rank 1 would never hear it
        wait_for(rank_1_heard.exists, "rank 1 to hear of rank 2 from rank 0", timeout=20)
    return silent, waited


@pytest.mark.slow
def test_every_rank_can_name_a_stopped_rank_that_only_rank_0_hears(tmp_path: Path) -> None:
    body = functools.partial(_rank_2_stops, rank_1_heard=tmp_path / "rank-1-heard")
    out = collect(*start_ranks(3, body, plane=Plane(warn_after_s=1.0, stderr_dir=tmp_path)), ranks=[0, 1])
    about = r" \(its process is stopped or hung, or its host or the network is\)"
    for rank, witness in ((0, ""), (1, ", as rank 0 sees it")):
        kind, answer = out[rank]
        assert kind == "ok", out
        silent, waited = answer
        assert len(silent) == 1, out
        said = re.fullmatch(rf"rank 2 stopped answering at step 5, (\d+) s ago{witness}{about}", silent[0])
        assert said, out
        # silent for dist.warn_after_s at least, and not longer than since the barrier it stopped after
        assert 1 <= int(said[1]) <= waited + 1, out


def _suspended_between_barriers(ctx: DistContext, released: Path) -> list[str]:
    ctx.barrier()
    print("between the barriers", file=sys.stderr, flush=True)
    # here the test suspends the whole job, and releases it before it resumes it
    wait_for(released.exists, "the test to release the ranks", timeout=60)
    ctx.barrier()
    return ctx.silent_ranks()


@pytest.mark.slow
def test_a_whole_job_suspended_past_the_timeout_then_resumed_goes_on(tmp_path: Path) -> None:
    """As Slurm's `scontrol suspend` / `resume` do: every rank stops, so no rank is to blame."""
    plane = Plane(timeout_s=3.0, warn_after_s=1.0, stderr_dir=tmp_path)
    released = tmp_path / "released"
    procs, results = start_ranks(2, functools.partial(_suspended_between_barriers, released=released), plane=plane)
    wait_for(
        lambda: all("between" in _text(tmp_path / f"rank-{r}.err") for r in (0, 1)),
        "the ranks to pass the first barrier",
        timeout=20,
    )
    for p in procs:
        os.kill(p.pid, signal.SIGSTOP)
    hold(
        plane.timeout_s + plane.warn_after_s + 0.5,
        "the whole job suspended longer than a rank may hear nothing "
        "from another before it ends the job (dist.timeout_s + dist.warn_after_s)",
    )
    released.touch()  # the ranks go on to the second barrier as soon as they are resumed
    for p in procs:
        os.kill(p.pid, signal.SIGCONT)
    assert collect(procs, results) == {0: ("ok", []), 1: ("ok", [])}
    assert (tmp_path / "rank-0.err").read_text() == "between the barriers\n"
