"""compute=mpi: hosts from the config, a hostfile or a cluster scheduler; the mpirun command
line; and real multi-host jobs, with this machine named twice in a hostfile.

OpenMPI starts its daemon on a host it does not take for its own through ``ssh`` (its ``rsh``
launcher). Here a stand-in for ssh (``compute.mpirun_args=[--mca,plm_rsh_agent,AGENT]``) runs the
daemon on this machine, in a bare environment as a login on another host would have: so the
"remote" ranks get only what mpirun passes on, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

import ddlkit
from ddlkit import ComputeTarget, JobSpec, JobState
from ddlkit.compute.ports import free_ports
from ddlkit.testing import RunFactory, add_plugin, wait_for
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit_mpi import plugin
from ddlkit_mpi.hosts import (
    SCHEDULER_SOURCES,
    Host,
    discover,
    expand_slurm_nodelist,
    parse_hostfile,
    parse_hosts,
    slurm_tasks_per_node,
)
from ddlkit_mpi.rank import host_node
from ddlkit_mpi.target import MpiConfig, MpiTarget, is_this_host

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (apt-get install openmpi-bin)"
)
#: a second name for this machine that OpenMPI does not take for its own (no interface has it;
#: Linux routes all of 127.0.0.0/8 to the loopback device)
OTHER_NAME = "127.0.0.2"


@pytest.fixture(autouse=True)
def _no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests run where a scheduler may have set its variables (a CI job in Slurm)."""
    for var in (*SCHEDULER_SOURCES, "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def spec_for(
    job_dir: Path, code: str, env: dict[str, str] | None = None, secret_env: dict[str, str] | None = None
) -> JobSpec:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text("{}")
    return JobSpec(name=job_dir.name, job_dir=job_dir, args=("-c", code), env=env or {}, secret_env=secret_env or {})


# ---------------------------------------------------------------------------- hostfiles
def test_hostfile_syntax(tmp_path: Path) -> None:
    hostfile = write(
        tmp_path / "hosts",
        """
        # the cluster
        node1 slots=4            # a comment after a host
        node2 slots=4 max_slots=8

        10.0.0.7
        node1 slots=2
        fd00::2 slots=1
    """,
    )
    assert parse_hostfile(hostfile) == [Host("node1", 6), Host("node2", 4), Host("10.0.0.7", None), Host("fd00::2", 1)]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("node1 slots=abc", "slots=abc is not a positive integer"),
        ("node1 slots=0", "slots=0 is not a positive integer"),
        ("node1 cores=4", "unknown key 'cores'"),
        ("node1 slots", "'slots' is not `key=value`"),
        ("slots=4", "'slots=4' is not a host name"),
        ("node/1", "'node/1' is not a host name"),
    ],
)
def test_a_bad_hostfile_line_is_named(tmp_path: Path, line: str, why: str) -> None:
    hostfile = write(tmp_path / "hosts", f"node0 slots=2\n\n{line}\n")
    with pytest.raises(ddlkit.ConfigError) as e:
        parse_hostfile(hostfile, what="compute.hostfile")
    assert str(e.value) == (
        f"compute.hostfile {hostfile}, line 3: {why} in {line!r} (expected `host [slots=N] [max_slots=M]`)."
    )


def test_missing_and_empty_hostfiles(tmp_path: Path) -> None:
    with pytest.raises(ddlkit.ConfigError, match=rf"^compute.hostfile {tmp_path}/nope does not exist.$"):
        parse_hostfile(tmp_path / "nope", what="compute.hostfile")
    with pytest.raises(ddlkit.ConfigError, match="names no host"):
        parse_hostfile(write(tmp_path / "empty", "# nothing\n\n"))


def test_hosts_option() -> None:
    assert parse_hosts(["a:4", "b", "10.0.0.1:2", "a:1"]) == [Host("a", 5), Host("b"), Host("10.0.0.1", 2)]
    for bad in ("a:0", "a:x", "", "a b:2"):
        with pytest.raises(ddlkit.ConfigError, match=rf"compute.hosts: {bad!r} is not a host"):
            parse_hosts([bad])


# ---------------------------------------------------------------------------- schedulers
def test_slurm_node_lists() -> None:
    assert expand_slurm_nodelist("node[01-03,07],gpu-a") == ["node01", "node02", "node03", "node07", "gpu-a"]
    assert expand_slurm_nodelist("r[1-2]n[1,3]") == ["r1n1", "r1n3", "r2n1", "r2n3"]
    assert expand_slurm_nodelist("single") == ["single"]
    for bad in ("node[1-", "node[3-1]", "a,,b", "node[x]"):
        with pytest.raises(ValueError):
            expand_slurm_nodelist(bad)
    assert slurm_tasks_per_node("4(x2),2", 3) == [4, 4, 2]
    with pytest.raises(ValueError):
        slurm_tasks_per_node("4(x2)", 3)


def test_hosts_come_from_the_scheduler_in_order(tmp_path: Path) -> None:
    batchai = write(tmp_path / "batchai", "10.0.0.4 slots=2\n10.0.0.5 slots=2\n")
    pbs = write(tmp_path / "pbs", "n1\nn1\nn2\nn2\n")
    env = {
        "AZ_BATCHAI_MPI_HOST_FILE": str(batchai),
        "AZ_BATCH_HOST_LIST": "10.0.0.8,10.0.0.9",
        "PBS_NODEFILE": str(pbs),
        "SLURM_JOB_NODELIST": "gpu[1-2]",
        "SLURM_TASKS_PER_NODE": "4(x2)",
    }
    assert discover([], None, env) == ([Host("10.0.0.4", 2), Host("10.0.0.5", 2)], "$AZ_BATCHAI_MPI_HOST_FILE")
    del env["AZ_BATCHAI_MPI_HOST_FILE"]
    assert discover([], None, env) == ([Host("10.0.0.8"), Host("10.0.0.9")], "$AZ_BATCH_HOST_LIST")
    del env["AZ_BATCH_HOST_LIST"]
    assert discover([], None, env) == ([Host("n1", 2), Host("n2", 2)], "$PBS_NODEFILE")
    del env["PBS_NODEFILE"]
    assert discover([], None, env) == ([Host("gpu1", 4), Host("gpu2", 4)], "$SLURM_JOB_NODELIST")
    env["SLURM_NTASKS_PER_NODE"] = "3"
    assert discover([], None, env)[0] == [Host("gpu1", 3), Host("gpu2", 3)]
    # the config wins over the scheduler
    assert discover(["x:1"], None, env) == ([Host("x", 1)], "compute.hosts")
    hostfile = write(tmp_path / "mine", "y slots=2\n")
    assert discover([], str(hostfile), env) == ([Host("y", 2)], f"compute.hostfile={hostfile}")


def test_scheduler_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ddlkit.ConfigError, match=r"^\$PBS_NODEFILE /gone does not exist.$"):
        discover([], None, {"PBS_NODEFILE": "/gone"})
    with pytest.raises(ddlkit.ConfigError, match=r"^\$SLURM_JOB_NODELIST='gpu\[1-' is not a Slurm node list"):
        discover([], None, {"SLURM_JOB_NODELIST": "gpu[1-"})
    with pytest.raises(ddlkit.ConfigError, match=r"SLURM_TASKS_PER_NODE='4' does not fit \$SLURM_JOB_NODELIST"):
        discover([], None, {"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_TASKS_PER_NODE": "4"})
    bad = write(tmp_path / "batchai", "10.0.0.4 slots=two\n")
    with pytest.raises(ddlkit.ConfigError, match=rf"^\$AZ_BATCHAI_MPI_HOST_FILE {bad}, line 1: slots=two"):
        discover([], None, {"AZ_BATCHAI_MPI_HOST_FILE": str(bad)})
    with pytest.raises(ddlkit.ConfigError, match="compute.hosts and compute.hostfile are both set"):
        discover(["a"], "hosts", {})


def test_no_hosts_anywhere_says_where_it_looked() -> None:
    with pytest.raises(ddlkit.ConfigError) as e:
        discover([], None, {})
    assert str(e.value) == (
        "compute=mpi found no hosts: set compute.hosts=[host:slots,...] or compute.hostfile=FILE, or run it inside "
        "a cluster job; looked at compute.hosts, compute.hostfile, $AZ_BATCHAI_MPI_HOST_FILE, $AZ_BATCH_HOST_LIST, "
        "$PBS_NODEFILE, $SLURM_JOB_NODELIST, $SLURM_NODELIST (all unset)."
    )


# ---------------------------------------------------------------------------- the target
def test_ranks_per_host_and_world_size(tmp_path: Path) -> None:
    hostfile = write(tmp_path / "hosts", "a slots=4\nb slots=2\n")
    target = MpiTarget(MpiConfig(hostfile=str(hostfile)))
    assert (target.node_sizes(), target.world_size) == ([4, 2], 6)
    assert MpiTarget(MpiConfig(hostfile=str(hostfile), procs_per_node=2)).world_size == 4
    assert MpiTarget(MpiConfig(hostfile=str(hostfile), nodes=1)).node_names() == ["a"]
    # a host whose source gives no slots runs procs_per_node ranks (default 1)
    assert MpiTarget(MpiConfig(hosts=["a", "b"])).world_size == 2
    assert MpiTarget(MpiConfig(hosts=["a", "b"], procs_per_node=8)).world_size == 16


def test_an_elastic_job_restarts_on_the_hosts_its_hostfile_still_lists(tmp_path: Path) -> None:
    hostfile = write(tmp_path / "hosts", "a slots=2\nb slots=2\nc slots=2\n")
    target = MpiTarget(MpiConfig(hostfile=str(hostfile), min_nodes=2))
    spec = spec_for(tmp_path / "job", "pass")
    assert (target.nodes, target.min_nodes, target.nodes_up(spec)) == (3, 2, 3)
    # host b is lost: a health check takes it out of the hostfile; a new host d is no host of this job
    write(tmp_path / "hosts", "a slots=2\nc slots=2\nd slots=2\n")
    assert target.nodes_up(spec) == 2
    smaller = target.with_nodes(2, spec)
    assert (smaller.node_names(), smaller.world_size, smaller.layout_args()) == (["a", "c"], 4, ["--node-sizes", "2,2"])
    assert smaller.placement_args() == ["-H", "a:2,c:2"]
    # b is back: the job grows back to its three hosts
    write(tmp_path / "hosts", "a slots=2\nb slots=2\nc slots=2\n")
    assert target.nodes_up(spec) == 3
    # a hostfile that cannot be read says nothing of the hosts: the job restarts on all of them
    (tmp_path / "hosts").unlink()
    assert target.nodes_up(spec) is None
    with pytest.raises(ddlkit.ConfigError, match=r"compute.min_nodes=4 must be between 1 and compute.nodes=3"):
        _ = MpiTarget(MpiConfig(hosts=["a", "b", "c"], min_nodes=4)).min_nodes


def test_more_ranks_than_slots_is_a_config_error(tmp_path: Path) -> None:
    # (the launcher asks the target's world size first thing: that is when the hosts are needed)
    hostfile = write(tmp_path / "hosts", "a slots=4\nb slots=2\n")
    with pytest.raises(ddlkit.ConfigError) as e:
        _ = MpiTarget(MpiConfig(hostfile=str(hostfile), procs_per_node=4)).world_size
    assert str(e.value) == (
        f"compute=mpi asks for 8 ranks (compute.procs_per_node=4 on 2 hosts) but the hosts have "
        f"6 slots: b has 2 (from compute.hostfile={hostfile})."
    )
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"compute.nodes=3 asks for more hosts than compute.hosts names "
        r"\(2: a, b\)",
    ):
        _ = MpiTarget(MpiConfig(hosts=["a:1", "b:1"], nodes=3)).world_size
    with pytest.raises(ddlkit.ConfigError, match="compute.master_port=65535 is invalid"):
        MpiTarget(MpiConfig(hosts=["a"], master_port=65535))
    with pytest.raises(ddlkit.ConfigError, match="compute.procs_per_node=0 is invalid"):
        MpiTarget(MpiConfig(hosts=["a"], procs_per_node=0))


def test_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    target = MpiTarget(
        MpiConfig(
            hosts=["node1:4", "node2:4"],
            python="/opt/conda/bin/python",
            scratch="/mnt/resource/ddlkit",
            mpirun_args=["--mca", "btl_tcp_if_include", "eth0"],
        )
    )
    spec = spec_for(tmp_path / "job", "pass", env={"DDLKIT_PLUGINS": "extra"}, secret_env={"WANDB_API_KEY": "k3y"})
    assert target.command(spec) == [
        "mpirun",
        "-np",
        "8",
        "-H",
        "node1:4,node2:4",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "-x",
        "DDLKIT_CONTROL_ADDR",
        "-x",
        "PYTHONUNBUFFERED",
        "-x",
        "OMP_NUM_THREADS",
        "-x",
        "DDLKIT_PLUGINS",
        "-x",
        "WANDB_API_KEY",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "/opt/conda/bin/python",
        "-m",
        "ddlkit_mpi.rank",
        "--job-dir",
        ".",
        "--node-sizes",
        "4,4",
        "--scratch",
        "/mnt/resource/ddlkit",
        "--cancel-file",
        ".ddlkit/cancel-requested",
        "--",
        "/opt/conda/bin/python",
        "-c",
        "pass",
    ]
    plan = target.plan(spec)
    assert shlex.split(plan) == target.command(spec)
    assert "k3y" not in plan and str(tmp_path) not in plan
    env = target.environment(spec)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["DDLKIT_CONTROL_ADDR"]) == ("node1", "29500", "node1:29501")
    assert (env["WANDB_API_KEY"], env["DDLKIT_PLUGINS"], env["PYTHONUNBUFFERED"]) == ("k3y", "extra", "1")
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 4))  # 4 ranks share each host's cores
    # without compute.python the ranks run this interpreter; without compute.scratch, nodes/ in the job directory
    default = MpiTarget(MpiConfig(hosts=["node1:1"])).command(spec)
    assert default[default.index("ddlkit_mpi.rank") - 2] == sys.executable
    assert default[default.index("--scratch") + 1] == "nodes"


def test_without_hosts_the_error_comes_when_they_are_needed(tmp_path: Path) -> None:
    """Built in another shell (``ddlkit jobs status``), outside the cluster job whose scheduler
    named the hosts, the target still attaches: from the layout recorded at submission."""
    target = MpiTarget(MpiConfig())
    for needs_hosts in (lambda: target.world_size, lambda: target.plan(spec_for(tmp_path / "job", "pass"))):
        with pytest.raises(ddlkit.ConfigError, match="^compute=mpi found no hosts"):
            needs_hosts()
    write(
        tmp_path / "job" / ".ddlkit" / "mpi-layout.json",
        json.dumps({"world_size": 6, "node_sizes": [4, 2], "node_names": ["a", "b"]}),
    )
    handle = target.attach("999999", job_dir=tmp_path / "job")
    assert (handle.world_size, handle.node_names) == (6, ("a", "b"))
    with pytest.raises(ddlkit.ConfigError, match="^compute=mpi found no hosts"):
        target.attach("999999", job_dir=tmp_path / "elsewhere")  # nothing recorded: the hosts are needed


def test_plan_needs_no_mpirun_but_submit_does(tmp_path: Path) -> None:
    target = MpiTarget(MpiConfig(hosts=["node1:2"], mpirun="no-such-mpirun"))
    assert target.plan(spec_for(tmp_path / "job", "pass")).startswith("no-such-mpirun -np 2 -H node1:2 ")
    with pytest.raises(ddlkit.ConfigError, match="compute=mpi needs OpenMPI's `no-such-mpirun`"):
        target.submit(spec_for(tmp_path / "job", "pass"))


def test_mpiruns_own_host_comes_first() -> None:
    """OpenMPI places the first ranks on mpirun's host whenever that host is listed: ddlkit lists
    it first, so rank 0's address and the node ids match where the ranks really run."""
    assert is_this_host("localhost") and is_this_host(socket.gethostname()) and not is_this_host(OTHER_NAME)
    target = MpiTarget(MpiConfig(hosts=["elsewhere:2", f"{socket.gethostname()}:3"]))
    assert target.placement_args() == ["-H", f"{socket.gethostname()}:3,elsewhere:2"]
    assert target.layout_args() == ["--node-sizes", "3,2"]
    # rank 0 on this host, named "localhost" by the user: the other hosts must reach it by a real name
    assert target.rendezvous()[0] == socket.gethostname()
    assert MpiTarget(MpiConfig(hosts=["elsewhere:2", "localhost:2"])).rendezvous()[0] == socket.gethostname()
    assert MpiTarget(MpiConfig(hosts=["localhost:2", "127.0.0.1:2"])).rendezvous()[0] == "localhost"


def test_node_of_a_rank_on_real_hosts() -> None:
    # hosts of 3, 2 and 3 ranks: OpenMPI's local rank and size, and the block each host's ranks form
    seen = [
        host_node(rank, local, size, [3, 2, 3])
        for rank, local, size in [(0, 0, 3), (2, 2, 3), (3, 0, 2), (4, 1, 2), (5, 0, 3), (7, 2, 3)]
    ]
    assert seen == [0, 0, 1, 1, 2, 2]


def run_rank_minder(job_dir: Path, code: str, *args: str, env: dict[str, str] | None = None):
    """``python -m ddlkit_mpi.rank`` as mpirun would start rank 0 of 1, without mpirun."""
    import subprocess

    job_dir.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
        **(env or {}),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit_mpi.rank",
            "--job-dir",
            ".",
            "--node-sizes",
            "1",
            *args,
            "--",
            sys.executable,
            "-c",
            code,
        ],
        cwd=job_dir,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_rank_that_starts_after_a_cancel_stops_at_once(tmp_path: Path) -> None:
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); time.sleep(30)"
    (tmp_path / "job" / ".ddlkit").mkdir(parents=True)
    (tmp_path / "job" / ".ddlkit" / "cancel-requested").write_text("now\n")
    t0 = time.monotonic()
    done = run_rank_minder(tmp_path / "job", code, "--cancel-file", ".ddlkit/cancel-requested")
    assert time.monotonic() - t0 < 20
    # stopped by the SIGTERM it was given (at once: maybe before its handler was installed)
    assert done.returncode in (75, 128 + 15), done
    record = json.loads((tmp_path / "job" / ".ranks" / "rank-0.json").read_text())
    assert record["code"] in (75, -15) and record["node"] == 0
    # without the marker the same rank runs on
    assert run_rank_minder(tmp_path / "other", "print('ran')").returncode == 0


def test_a_rank_outside_the_job_directory_refuses_to_start(tmp_path: Path) -> None:
    done = run_rank_minder(
        tmp_path / "home",
        "print('should not run')",
        env={"OMPI_MCA_initial_wdir": str(tmp_path / "job-on-the-launcher")},
    )
    assert done.returncode == 1
    assert f"the job directory {tmp_path / 'job-on-the-launcher'} does not exist on host" in done.stderr
    assert "should not run" not in done.stdout


def test_plugin_registers_mpi(ddlkit_pm) -> None:
    from ddlkit.testing.core import Registry

    add_plugin(ddlkit_pm, plugin, name="local_mpi")
    registration = Registry.collect(ddlkit_pm).get("compute", "mpi")
    assert registration.factory is MpiTarget and registration.config is MpiConfig


# ---------------------------------------------------------------------------- through the CLI
def test_ddlkit_plan_prints_the_mpirun_command(run_factory: RunFactory, tmp_path: Path) -> None:
    out = run_factory.cli(
        "plan", "compute=mpi", "compute.hosts=[node1:2,node2:2]", "dist=native", "compute.mpirun=no-such-mpirun"
    ).assert_success()
    runs = next(line for line in out.stdout.splitlines() if line.strip().startswith("runs: "))
    command = shlex.split(runs.split("runs: ", 1)[1])
    assert command[:5] == ["no-such-mpirun", "-np", "4", "-H", "node1:2,node2:2"]
    assert command[-5:] == ["--", sys.executable, "-m", "ddlkit.rank.worker", "job.json"]
    assert "compute=mpi, world size 4" in out.stdout


def test_too_many_ranks_through_the_cli_is_one_line_exit_2(run_factory: RunFactory, tmp_path: Path) -> None:
    hostfile = write(tmp_path / "hosts", "node1 slots=2\nnode2 slots=1\n")
    out = run_factory(
        "compute=mpi", f"compute.hostfile={hostfile}", "compute.procs_per_node=2", "dist=native"
    ).assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: compute=mpi asks for 4 ranks (compute.procs_per_node=2 on 2 hosts) but the "
        f"hosts have 3 slots: node2 has 1 (from compute.hostfile={hostfile}).\n"
    )
    out = run_factory("compute=mpi", "dist=native").assert_returncode(2)
    assert out.stderr.startswith("ddlkit: error: compute=mpi found no hosts: ") and out.stderr.count("\n") == 1


def test_bad_hostfile_through_the_cli_is_one_line_exit_2(run_factory: RunFactory, tmp_path: Path) -> None:
    hostfile = write(tmp_path / "hosts", "node1 slots=2\nnode2 slots=many\n")
    out = run_factory("compute=mpi", f"compute.hostfile={hostfile}", "dist=native").assert_returncode(2)
    assert out.stderr == (
        f"ddlkit: error: compute.hostfile {hostfile}, line 2: slots=many is not a positive integer "
        "in 'node2 slots=many' (expected `host [slots=N] [max_slots=M]`).\n"
    )
    out = run_factory("compute=mpi", f"compute.hostfile={hostfile}x", "dist=native").assert_returncode(2)
    assert out.stderr == f"ddlkit: error: compute.hostfile {hostfile}x does not exist.\n"


# ---------------------------------------------------------------------------- real jobs
class TwoHosts:
    """This machine twice in a hostfile: ``localhost`` (mpirun's own host) and ``127.0.0.2``,
    reached through an ssh stand-in that records each host it is asked to log in to. What it
    starts runs as on another machine: in a session of its own (out of reach of the launcher's
    process-session kills) and a bare environment (what a login has)."""

    def __init__(self, base: Path, hostfile: str = f"# this machine, twice\nlocalhost slots=2\n{OTHER_NAME} slots=2\n"):
        base.mkdir(parents=True, exist_ok=True)
        self.hostfile = write(base / "hostfile", hostfile)
        self.logins = base / "ssh-logins"
        self.agent = base / "fake-ssh"
        # ssh [options] HOST COMMAND
        self.agent.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
echo "$1" >> {shlex.quote(str(self.logins))}
shift
exec setsid env -i HOME="$HOME" PATH="$PATH" /bin/sh -c "$*"
""")
        self.agent.chmod(self.agent.stat().st_mode | stat.S_IXUSR)
        self.port = free_ports(2)[0]  # MASTER_PORT and the control plane's

    @property
    def overrides(self) -> list[str]:
        return [
            "compute=mpi",
            f"compute.hostfile={self.hostfile}",
            f"compute.master_port={self.port}",
            f"compute.mpirun_args=[--mca,plm_rsh_agent,{self.agent}]",
        ]

    def config(self, **kw: object) -> MpiConfig:
        return MpiConfig(
            hostfile=str(self.hostfile),
            master_port=self.port,
            mpirun_args=["--mca", "plm_rsh_agent", str(self.agent)],
            **kw,
        )

    def remote_logins(self) -> list[str]:
        return self.logins.read_text().split() if self.logins.exists() else []


@pytest.fixture
def two_hosts(tmp_path: Path) -> TwoHosts:
    return TwoHosts(tmp_path / "cluster")


@pytest.mark.slow
@needs_mpirun
class TestMpiTarget(ComputeTargetContract):
    @pytest.fixture
    def target(self, two_hosts: TwoHosts) -> ComputeTarget:
        return MpiTarget(two_hosts.config(grace_period_s=5.0))


LAYOUT = """
import json, os, socket
from ddlkit import DistContext
ctx = DistContext.from_env()
print(json.dumps({"rank": ctx.rank, "world": ctx.world_size, "node": ctx.node, "local_rank": ctx.local_rank,
                  "local_size": ctx.local_size, "scratch": ctx.node_scratch, "cwd": os.getcwd(),
                  "master": os.environ.get("MASTER_ADDR"), "control": os.environ.get("DDLKIT_CONTROL_ADDR"),
                  "plain": os.environ.get("JOB_PLAIN"), "secret": os.environ.get("JOB_SECRET"),
                  "bare": "PYTEST_CURRENT_TEST" not in os.environ}), flush=True)
"""


@pytest.mark.slow
@needs_mpirun
def test_ranks_learn_their_host_layout_and_get_the_jobs_environment(tmp_path: Path) -> None:
    # uneven hosts, mpirun's own host listed last: OpenMPI still places ranks 0-2 on it
    two_hosts = TwoHosts(tmp_path / "cluster", f"{OTHER_NAME} slots=1\nlocalhost slots=3\n")
    target = MpiTarget(two_hosts.config(scratch="$HOME/../" + str(tmp_path / "ssd")))
    job_dir = tmp_path / "job"
    handle = target.submit(spec_for(job_dir, LAYOUT, env={"JOB_PLAIN": "plain"}, secret_env={"JOB_SECRET": "s3"}))
    console = "".join(handle.logs())
    assert handle.wait(timeout=60).state is JobState.SUCCEEDED, console
    assert two_hosts.remote_logins() == [OTHER_NAME]  # OpenMPI took 127.0.0.2 for another host
    seen = [json.loads((job_dir / f"rank-{r}.log").read_text()) for r in range(4)]
    assert [(s["rank"], s["node"], s["local_rank"], s["local_size"], s["world"]) for s in seen] == [
        (0, 0, 0, 3, 4),
        (1, 0, 1, 3, 4),
        (2, 0, 2, 3, 4),
        (3, 1, 0, 1, 4),
    ]
    # rank 3 started from the bare "login": only what mpirun passed on reached it
    assert [s["bare"] for s in seen] == [False, False, False, True]
    # rank 0 runs on the first host, "localhost": the other host reaches it by this machine's name
    host = socket.gethostname()
    assert {(s["master"], s["control"], s["plain"], s["secret"], s["cwd"]) for s in seen} == {
        (host, f"{host}:{two_hosts.port + 1}", "plain", "s3", str(job_dir))
    }
    # compute.scratch is expanded on the node ($HOME there), node-K below it
    assert [Path(s["scratch"]).resolve() for s in seen] == [tmp_path / "ssd" / f"node-{n}" for n in (0, 0, 0, 1)]
    assert json.loads(console.strip()) == seen[0]
    assert json.loads((job_dir / ".ddlkit" / "mpi-layout.json").read_text()) == {
        "world_size": 4,
        "node_sizes": [3, 1],
        "node_names": ["localhost", OTHER_NAME],
    }


@pytest.mark.slow
@needs_mpirun
def test_a_failing_rank_on_the_other_host_is_named(two_hosts: TwoHosts, tmp_path: Path) -> None:
    code = (
        "import os, sys; r = os.environ['OMPI_COMM_WORLD_RANK']; print('rank', r, flush=True); "
        "sys.exit(3 if r == '3' else 0)"
    )
    handle = MpiTarget(two_hosts.config()).submit(spec_for(tmp_path / "job", code))
    status = handle.wait(timeout=60)
    assert (status.state, status.exit_code) == (JobState.FAILED, 3)
    assert status.message.startswith(
        f"rank 3 (node 1, host {OTHER_NAME}) failed first, with exit status 3; "
        f"last lines of {tmp_path / 'job' / 'rank-3.log'}:\n    rank 3"
    )


#: how long each rank takes to checkpoint when asked to stop: a rank asked only once the others
#: have ended (when mpirun aborts the job) is asked this much later than they are
CHECKPOINT_S = 2.0
STOPPER = f"""
import os, signal, sys, time
def stop(signum, frame):
    print(f"asked to stop at {{time.time()}}", flush=True)
    time.sleep({CHECKPOINT_S})  # checkpointing
    print("checkpointed", flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
@needs_mpirun
def test_cancel_reaches_the_ranks_on_every_host_through_mpirun(two_hosts: TwoHosts, tmp_path: Path) -> None:
    target = MpiTarget(two_hosts.config(grace_period_s=60.0))
    job_dir = tmp_path / "job"
    handle = target.submit(spec_for(job_dir, STOPPER))
    wait_for(lambda: sum("ready" in p.read_text() for p in job_dir.glob("rank-*.log")) >= 4, "the four ranks to start")
    t0, wall0 = time.monotonic(), time.time()
    target.attach(handle.id, job_dir=job_dir).cancel()  # as `ddlkit jobs cancel` does, from another handle
    status = handle.wait(timeout=30)
    # long before the 60 s grace period: every rank stopped by itself, none was killed
    assert time.monotonic() - t0 < 15
    assert (status.state, status.exit_code) == (JobState.CANCELLED, 75), status
    assert [json.loads((job_dir / ".ranks" / f"rank-{r}.json").read_text())["code"] for r in range(4)] == [75] * 4
    logs = [(job_dir / f"rank-{r}.log").read_text() for r in range(4)]
    assert all("checkpointed" in log for log in logs)
    # the ranks on the other host were asked at once, not when mpirun aborted the job because the
    # ranks on this host had ended (CHECKPOINT_S later)
    asked = [float(log.split("asked to stop at ", 1)[1].split()[0]) - wall0 for log in logs]
    assert max(asked) < CHECKPOINT_S - 0.5, asked


@pytest.mark.slow
@needs_mpirun
def test_a_four_rank_job_trains_across_the_two_hosts(
    two_hosts: TwoHosts, run_factory: RunFactory, tmp_path: Path
) -> None:
    job_dir = tmp_path / "train"
    t0 = time.monotonic()
    out = run_factory(
        *two_hosts.overrides,
        "dist=native",
        "trainer.epochs=2",
        "data.length=256",
        "data.val_length=64",
        "trainer.batch_size=8",
        "trainer.log_every=2",
        job_dir=job_dir,
        timeout=240,
    ).assert_success()
    took = time.monotonic() - t0
    result = out.result
    assert (result["status"], result["world_size"], result["global_batch_size"]) == ("completed", 4, 32)
    assert result["steps"] == 2 * 256 // 32
    assert two_hosts.remote_logins() == [OTHER_NAME]
    for rank in range(4):
        assert (job_dir / f"rank-{rank}.log").is_file()
    records = [json.loads((job_dir / ".ranks" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [(r["node"], r["local_rank"], r["code"]) for r in records] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    print(f"4-rank compute=mpi job (framework=fake): {took:.1f} s through the CLI")


@pytest.mark.slow
@needs_mpirun
def test_a_four_rank_pytorch_job_trains_across_the_two_hosts(
    two_hosts: TwoHosts, run_factory: RunFactory, tmp_path: Path
) -> None:
    pytest.importorskip("ddlkit_pytorch")
    job_dir = tmp_path / "torch"
    t0 = time.monotonic()
    out = run_factory(
        *two_hosts.overrides,
        "framework=pytorch",
        "model=resnet18",
        "dist=native",
        "data.image_size=32",
        "data.num_classes=10",
        "data.length=128",
        "data.val_length=32",
        "trainer.batch_size=4",
        "trainer.epochs=1",
        "trainer.log_every=2",
        job_dir=job_dir,
        timeout=400,
    ).assert_success()
    took = time.monotonic() - t0
    assert (out.result["world_size"], out.result["steps"]) == (4, 128 // 16)
    assert (job_dir / "model.pt").is_file()
    print(f"4-rank compute=mpi job (pytorch resnet18, 32 px): {took:.1f} s through the CLI")
