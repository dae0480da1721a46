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
