"""The plugin's tests use ddlkit's test kit, as any plugin's would, and a real Slurm cluster:
the one ``$SLURM_CONF`` names if its controller answers, else the single-node cluster that
``scripts/local_slurm.sh start`` starts on this machine (it needs root and Debian's packages:
apt-get install slurmctld slurmd slurm-client munge). Tests that need it skip, saying why, when
neither can run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ["ddlkit.testing"]

#: the repository's script, when the plugin is tested from ddlkit's checkout
LOCAL_SLURM = Path(__file__).resolve().parents[3] / "scripts" / "local_slurm.sh"


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Environment restored, a working directory of its own, fresh plugin and Hydra state."""


def _controller_answers(env: dict[str, str]) -> bool:
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "UP" in proc.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """A running Slurm cluster; ``SLURM_CONF`` is set for the whole session (returns its value)."""
    if shutil.which("sbatch") is None:
        pytest.skip("Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    if os.environ.get("SLURM_CONF") and _controller_answers(dict(os.environ)):
        return os.environ["SLURM_CONF"]
    if not LOCAL_SLURM.is_file():
        pytest.skip("no Slurm controller answers and scripts/local_slurm.sh is not here to start one")
    if os.geteuid() != 0:
        pytest.skip("no Slurm controller answers and scripts/local_slurm.sh needs root to start one")
    proc = subprocess.run(["bash", str(LOCAL_SLURM), "start"], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        pytest.skip(f"scripts/local_slurm.sh start failed: {proc.stderr.strip()[-500:]}")
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    # session-wide, set before any test's environment snapshot (ddlkit_isolation) is taken
    os.environ["SLURM_CONF"] = conf
    if not _controller_answers(dict(os.environ)):
        pytest.skip("scripts/local_slurm.sh started Slurm but its controller does not answer")
    return conf


#: the two-node cluster's own directory and controller port, so that it runs beside the single-node one
TWO_NODE_DIR, TWO_NODE_PORT = "/tmp/ddlkit-slurm-2nodes", "7817"


@pytest.fixture(scope="session")
def two_node_slurm() -> dict[str, str]:
    """The environment (``SLURM_CONF``) of a running Slurm cluster of two nodes, ``<host>-1`` and
    ``<host>-2``: two slurmd on this machine (``scripts/local_slurm.sh`` with ``DDLKIT_SLURM_NODES=2``),
    for tests that take a node down and bring it back. Its jobs are given this environment; the
    session's ``SLURM_CONF`` stays the single-node cluster's."""
    if shutil.which("sbatch") is None:
        pytest.skip("Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    env = {
        **os.environ,
        "DDLKIT_SLURM_NODES": "2",
        "DDLKIT_SLURM_DIR": TWO_NODE_DIR,
        "DDLKIT_SLURM_PORT": TWO_NODE_PORT,
        "SLURM_CONF": f"{TWO_NODE_DIR}/slurm.conf",
    }
    if not _controller_answers(env):
        if os.geteuid() != 0 or not LOCAL_SLURM.is_file():
            pytest.skip("a two-node Slurm cluster needs root and scripts/local_slurm.sh to start")
        proc = subprocess.run(
            ["bash", str(LOCAL_SLURM), "start"], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            pytest.skip(f"scripts/local_slurm.sh start (2 nodes) failed: {proc.stderr.strip()[-500:]}")
    return {k: v for k, v in env.items() if not k.startswith("DDLKIT_SLURM_")}
