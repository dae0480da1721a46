"""compute=local_mpi: the compute-target contract, the simulated node layout, rank logs, and
what happens when a rank dies or the job is cancelled -- with the real mpirun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddlkit
from ddlkit import ComputeTarget, JobSpec, JobState
from ddlkit.compute.rank_minder import ErrorFilter
from ddlkit.testing import add_plugin, alive, make_run, wait_for
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit_mpi import plugin
from ddlkit_mpi.rank import node_layout
from ddlkit_mpi.target import LocalMpiConfig, LocalMpiTarget

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (apt-get install openmpi-bin)"
)


def spec_for(
    job_dir: Path, code: str, env: dict[str, str] | None = None, secret_env: dict[str, str] | None = None
) -> JobSpec:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text("{}")
    return JobSpec(name=job_dir.name, job_dir=job_dir, args=("-c", code), env=env or {}, secret_env=secret_env or {})


# ---------------------------------------------------------------------------- without mpirun
def test_ranks_fill_the_nodes_one_after_the_other() -> None:
    assert [node_layout(r, 2) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [node_layout(r, 3) for r in range(4)] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_error_filter_passes_error_lines_and_whole_tracebacks() -> None:
    f = ErrorFilter()
    picked = f.feed(b'step 1 ok\nWARNING: slow\nTraceback (most recent call last):\n  File "x.py", line 1\n')
    picked += f.feed(b"    boom()\nRuntimeError: the disk is on fire\nstep 2 ok\nCUDA out of memory. Tried")
    picked += f.feed(b" to allocate 2 GiB\n")
    assert picked == [
        b"Traceback (most recent call last):",
        b'  File "x.py", line 1',
        b"    boom()",
        b"RuntimeError: the disk is on fire",
        b"CUDA out of memory. Tried to allocate 2 GiB",
    ]
    # a rank that says rank 0 went silent is heard on the console: rank 0 itself cannot say it
    warning = b"ddlkit: rank 0 has not been heard from for 60 s (last at step 12): stopped or hung?"
    assert f.feed(b"step 3 ok\n" + warning + b"\nddlkit: rank 0 is answering again, after 70 s of silence\n") == [
        warning,
        b"ddlkit: rank 0 is answering again, after 70 s of silence",
    ]


def test_world_size_and_command(tmp_path: Path) -> None:
    target = LocalMpiTarget(LocalMpiConfig(nodes=2, procs_per_node=3, scratch=str(tmp_path / "ssd")))
    assert target.world_size == 6
    spec = spec_for(tmp_path / "job", "pass", env={"DDLKIT_PLUGINS": "x"}, secret_env={"API_KEY": "s3cr3t"})
    cmd = target.command(spec)
    assert cmd[:3] == ["mpirun", "-np", "6"]
    assert {"--oversubscribe", "--bind-to"} <= set(cmd)
    # the job's environment is passed on by name: no value (no secret) on the command line
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"] == [
        "MASTER_ADDR",
        "MASTER_PORT",
        "DDLKIT_CONTROL_ADDR",
        "PYTHONUNBUFFERED",
        "OMP_NUM_THREADS",
        "GLOO_SOCKET_IFNAME",
        "DDLKIT_PLUGINS",
        "API_KEY",
    ]
    assert "s3cr3t" not in target.plan(spec)
    minder = cmd.index("ddlkit_mpi.rank")
    # the ranks run in the job directory: the command names none of the launcher's job paths
    assert cmd[minder - 2 : minder + 9] == [
        sys.executable,
        "-m",
        "ddlkit_mpi.rank",
        "--job-dir",
        ".",
        "--procs-per-node",
        "3",
        "--scratch",
        str(tmp_path / "ssd"),
        "--cancel-file",
        ".ddlkit/cancel-requested",
    ]
    assert cmd[-4:] == ["--", sys.executable, "-c", "pass"]
    assert str(tmp_path / "job") not in target.plan(spec)
    default = LocalMpiTarget(LocalMpiConfig()).command(spec)
    assert default[default.index("--scratch") + 1] == "nodes"  # relative: nodes/ in the job directory
    assert target.command(spec, python="python3")[minder - 2] == "python3"
    assert target.command(spec, python="python3")[-3:] == ["python3", "-c", "pass"]


def test_environment_gives_loopback_rendezvous_and_shares_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    target = LocalMpiTarget(LocalMpiConfig(nodes=1, procs_per_node=2))
    env = target.environment(spec_for(tmp_path, "pass", env={"PLAIN": "p"}, secret_env={"SECRET_TOKEN": "s3cr3t"}))
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["DDLKIT_CONTROL_ADDR"].startswith("127.0.0.1:")
    assert env["MASTER_PORT"] != env["DDLKIT_CONTROL_ADDR"].rsplit(":", 1)[1]
    assert env["SECRET_TOKEN"] == "s3cr3t"  # secrets travel in the environment, never on mpirun's command line
    assert env["PLAIN"] == "p" and env["GLOO_SOCKET_IFNAME"] == "lo" and env["PATH"] == os.environ["PATH"]
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    four = LocalMpiTarget(LocalMpiConfig(nodes=2, procs_per_node=2)).environment(spec_for(tmp_path, "pass"))
    assert four["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 4))  # all 4 ranks share this machine
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert target.environment(spec_for(tmp_path, "pass"))["OMP_NUM_THREADS"] == "7"


def test_mpirun_does_not_wait_for_munge_on_one_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With munge installed and its daemon stopped, PMIx retried it for 2 s at every (re)start."""
    monkeypatch.delenv("PMIX_MCA_psec", raising=False)
    target = LocalMpiTarget(LocalMpiConfig(nodes=2, procs_per_node=1))
    assert target.environment(spec_for(tmp_path, "pass"))["PMIX_MCA_psec"] == "native"
    monkeypatch.setenv("PMIX_MCA_psec", "munge")  # the user's choice stays
    assert target.environment(spec_for(tmp_path, "pass"))["PMIX_MCA_psec"] == "munge"


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ddlkit.ConfigError, match=r"compute.nodes=0 is invalid"):
        LocalMpiTarget(LocalMpiConfig(nodes=0))
    with pytest.raises(ddlkit.ConfigError, match="apt-get install openmpi-bin"):
        LocalMpiTarget(LocalMpiConfig(mpirun="no-such-mpirun"))


@needs_mpirun
def test_the_launcher_checks_the_job_against_the_number_of_ranks(ddlkit_pm, tmp_path: Path) -> None:
    add_plugin(ddlkit_pm, plugin, name="local_mpi")
    four = ("compute=local_mpi", "compute.nodes=2", "compute.procs_per_node=2")
    with pytest.raises(ddlkit.ConfigError, match="runs 4 ranks, which must share their gradients: add dist=native"):
        make_run(ddlkit_pm, tmp_path / "a", *four)
    with pytest.raises(ddlkit.ConfigError, match=r"fewer than one global batch of 128 \(trainer.batch_size=32 x 4"):
        make_run(ddlkit_pm, tmp_path / "b", *four, "dist=native", "data.length=100")


# ---------------------------------------------------------------------------- with mpirun
@pytest.mark.slow
@needs_mpirun
class TestLocalMpiTarget(ComputeTargetContract):
    @pytest.fixture
    def target(self) -> ComputeTarget:
        return LocalMpiTarget(LocalMpiConfig(nodes=1, procs_per_node=2, grace_period_s=5.0))


LAYOUT = """
import json, os
from ddlkit import DistContext
ctx = DistContext.from_env()
print(json.dumps({"rank": ctx.rank, "world": ctx.world_size, "node": ctx.node, "local_rank": ctx.local_rank,
                  "local_size": ctx.local_size, "scratch": ctx.node_scratch}), flush=True)
"""


@pytest.mark.slow
@needs_mpirun
def test_simulated_nodes_have_their_own_layout_and_scratch(tmp_path: Path) -> None:
    target = LocalMpiTarget(LocalMpiConfig(nodes=2, procs_per_node=2, scratch=str(tmp_path / "ssd")))
    handle = target.submit(spec_for(tmp_path / "job", LAYOUT))
    console = "".join(handle.logs())
    assert handle.wait(timeout=60).state is JobState.SUCCEEDED
    seen = [json.loads((tmp_path / "job" / f"rank-{r}.log").read_text()) for r in range(4)]
    assert [(s["rank"], s["node"], s["local_rank"], s["local_size"], s["world"]) for s in seen] == [
        (0, 0, 0, 2, 4),
        (1, 0, 1, 2, 4),
        (2, 1, 0, 2, 4),
        (3, 1, 1, 2, 4),
    ]
    assert [s["scratch"] for s in seen] == [str(tmp_path / "ssd" / f"node-{n}") for n in (0, 0, 1, 1)]
    assert (tmp_path / "ssd" / "node-0").is_dir() and (tmp_path / "ssd" / "node-1").is_dir()
    # the console is rank 0's output only
    assert json.loads(console.strip()) == seen[0]


@pytest.mark.slow
@needs_mpirun
def test_console_shows_rank_0_and_the_other_ranks_errors(tmp_path: Path) -> None:
    code = """
import os, sys
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
print(f"progress of rank {rank}", flush=True)
print(f"a harmless note from rank {rank}", file=sys.stderr, flush=True)
if rank == 1:
    raise RuntimeError("rank 1 cannot go on")
"""
    handle = LocalMpiTarget(LocalMpiConfig(nodes=1, procs_per_node=2)).submit(spec_for(tmp_path / "job", code))
    console = "".join(handle.logs())
    status = handle.wait(timeout=60)
    assert "progress of rank 0" in console and "a harmless note from rank 0" in console
    assert "progress of rank 1" not in console and "a harmless note from rank 1" not in console
    assert "[rank 1] Traceback (most recent call last):" in console
    assert "[rank 1] RuntimeError: rank 1 cannot go on" in console
    assert (status.state, status.exit_code) == (JobState.FAILED, 1)
    assert status.message.startswith("rank 1 (node 0) failed first, with exit status 1; last lines of ")
    assert "RuntimeError: rank 1 cannot go on" in status.message
    log1 = (tmp_path / "job" / "rank-1.log").read_text()
    assert "progress of rank 1" in log1 and "a harmless note from rank 1" in log1


SLEEPER = """
import os, time
from pathlib import Path
rank = os.environ["OMPI_COMM_WORLD_RANK"]
Path(f"pid-{rank}").write_text(str(os.getpid()))
print(f"rank {rank} is working", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
@needs_mpirun
def test_a_killed_rank_ends_the_whole_job_within_seconds(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    handle = LocalMpiTarget(LocalMpiConfig(nodes=2, procs_per_node=2)).submit(spec_for(job_dir, SLEEPER))
    # the ranks run in the job directory
    wait_for(lambda: len(list(job_dir.glob("pid-*"))) >= 4, "the four ranks to start")
    mpirun = handle._mpirun()
    assert mpirun is not None and "mpirun" in Path(f"/proc/{mpirun}/cmdline").read_text()
    pids = {int(p.name[4:]): int(p.read_text()) for p in job_dir.glob("pid-*")}
    t0 = time.monotonic()
    os.kill(pids[2], signal.SIGKILL)
    status = handle.wait(timeout=30)
    took = time.monotonic() - t0
    assert took < 5, f"the job took {took:.1f} s to end after rank 2 died"
    assert (status.state, status.exit_code) == (JobState.FAILED, -9)
    assert status.message.startswith(
        "rank 2 (node 1) failed first, with killed by signal SIGKILL; last lines of "
        f"{job_dir / 'rank-2.log'}:\n    rank 2 is working"
    )
    assert not [p for p in pids.values() if alive(p)]
    assert not alive(mpirun)


@pytest.mark.slow
@needs_mpirun
def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    code = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""
    handle = LocalMpiTarget(LocalMpiConfig(procs_per_node=2, grace_period_s=1.0)).submit(spec_for(tmp_path, code))
    next(chunk for chunk in handle.logs() if "ready" in chunk)
    t0 = time.monotonic()
    handle.cancel()
    status = handle.wait(timeout=20)
    assert 0.9 < time.monotonic() - t0 < 10
    assert status.state is JobState.CANCELLED


@pytest.mark.slow
@needs_mpirun
def test_a_rerun_in_the_same_directory_is_judged_on_its_own(tmp_path: Path) -> None:
    target = LocalMpiTarget(LocalMpiConfig(procs_per_node=2))
    failing = target.submit(spec_for(tmp_path, "import sys; sys.exit(4)"))
    assert failing.wait(timeout=60).exit_code == 4
    again = target.submit(spec_for(tmp_path, "print('fine now')"))
    assert again.wait(timeout=60).state is JobState.SUCCEEDED


STOPPER = """
import os, signal, sys, time
def stop(signum, frame):
    print(f"rank {os.environ['OMPI_COMM_WORLD_RANK']} checkpoints and stops", flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
print(f"rank {os.environ['OMPI_COMM_WORLD_RANK']} ready", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
@needs_mpirun
def test_cancel_from_another_process_reaches_every_rank_and_not_mpirun(tmp_path: Path) -> None:
    """``ddlkit jobs cancel`` works on an attached handle: every rank's worker gets SIGTERM (and
    checkpoints, exit 75), mpirun is left to see its ranks end."""
    target = LocalMpiTarget(LocalMpiConfig(nodes=2, procs_per_node=2, grace_period_s=30))
    job_dir = tmp_path / "job"
    handle = target.submit(spec_for(job_dir, STOPPER))
    wait_for(lambda: sum("ready" in p.read_text() for p in job_dir.glob("rank-*.log")) >= 4, "the four ranks to start")
    other = target.attach(handle.id, job_dir=job_dir)
    assert other.proc is None  # a handle as another process builds it: no child of its own
    t0 = time.monotonic()
    other.cancel()
    status = other.wait(timeout=30)
    assert time.monotonic() - t0 < 10
    assert (status.state, status.exit_code) == (JobState.CANCELLED, 75), status
    records = [json.loads((job_dir / ".ranks" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [r["code"] for r in records] == [75] * 4  # each stopped on its own, none was killed
    assert handle.wait(timeout=10).state is JobState.CANCELLED


def test_plugin_registers_local_mpi(ddlkit_pm) -> None:
    from ddlkit.testing.core import Registry

    add_plugin(ddlkit_pm, plugin, name="local_mpi")
    registration = Registry.collect(ddlkit_pm).get("compute", "local_mpi")
    assert registration.factory is LocalMpiTarget and registration.config is LocalMpiConfig


def _rank_process(job_dir: Path, module: str, rank: int) -> int | None:
    """The pid of rank ``rank``'s ``python -m module`` in ``job_dir`` (its rank wrapper or its worker)."""
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if b"-m" not in args or args[args.index(b"-m") + 1] != module.encode():
                continue
            if os.readlink(entry / "cwd") != str(job_dir):
                continue
            env = dict(line.split(b"=", 1) for line in (entry / "environ").read_bytes().split(b"\0") if b"=" in line)
        except (OSError, ValueError, IndexError):
            continue
        if env.get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode():
            return int(entry.name)
    return None


@pytest.mark.slow
@needs_mpirun
@pytest.mark.parametrize(
    ("module", "sig", "headline"),
    [
        (
            "ddlkit_mpi.rank",
            signal.SIGKILL,
            "rank 1 was killed by signal SIGKILL first; rank 0 (node 0) failed waiting for it, with exit status 76: ",
        ),
        (
            "ddlkit.rank.worker",
            signal.SIGSTOP,
            "rank 1 stopped answering first; rank 0 (node 0) failed waiting for it, with exit status 76: ",
        ),
    ],
    ids=["wrapper-killed", "worker-stopped"],
)
def test_the_headline_names_the_rank_that_failed_first_not_the_one_that_waited(
    module: str, sig: signal.Signals, headline: str, tmp_path: Path
) -> None:
    """Rank 1 stopped, or its rank wrapper killed: it reports nothing, rank 0 fails waiting for it
    and was named as the rank that failed (issue 23, minor)."""
    job_dir = tmp_path / "job"
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            "compute=local_mpi",
            "compute.procs_per_node=2",
            "dist=native",
            "framework.step_delay_s=0.2",
            "data.length=6400",
            "dist.timeout_s=5",
            "dist.warn_after_s=2",
            "restart.max_restarts=0",
            f"hydra.run.dir={job_dir}",
        ],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        log = job_dir / "rank-0.log"
        wait_for(
            lambda: log.is_file() and "step 10/" in log.read_text(),
            "the job to train",
            timeout=90,
            pace=0.2,
            process=launcher,
        )
        pid = _rank_process(job_dir, module, 1)
        assert pid is not None
        os.kill(pid, sig)
        _, stderr = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == 76, stderr  # EXIT_LOST_PEER: rank 0 stopped because rank 1 was lost
    assert stderr.startswith(f"ddlkit: error: job {job_dir.parent.name}_job-"), stderr
    # rank 0's error line, then its log (the console streamed its last lines: not repeated)
    assert f" failed: {headline}ddlkit worker (rank 0): RankLostError: " in stderr, stderr
    assert f"(the whole log: {job_dir / 'rank-0.log'})" in stderr, stderr
