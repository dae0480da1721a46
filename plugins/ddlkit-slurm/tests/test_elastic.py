"""Elastic world size on a real Slurm cluster of two nodes (issue 27): ``scripts/local_slurm.sh``
with ``DDLKIT_SLURM_NODES=2`` -- two slurmd on this machine, a cluster beside the single-node one the
other tests use. Node 2 is drained (Slurm gives it to no new job) and its rank killed, as when a
node fails: the job restarts on the node that remains, which ``sinfo`` tells; node 2 is resumed and
a preemption notice (SIGTERM to a rank) ends the job again, which grows back to both nodes. Nothing
may be lost: the final checkpoint verifies, the steps add up, each epoch trains every sample once,
and the weights are those of a job that never lost a node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ddlkit.compute.restarts import step_reached
from ddlkit.testing.core import latest_checkpoint, verify
from ddlkit.testing.elastic import assert_every_sample_once, restarts
from ddlkit.testing.fakes import MODEL_FILE
from ddlkit.testing.multirank import worker_pids

pytestmark = pytest.mark.slow

NODE_2 = f"{socket.gethostname().split('.')[0]}-2"

# 2 nodes x 1 rank, a global batch of 16 (8 per rank): 16 steps per epoch of 256 numbered samples
JOB = (
    "framework=fake",
    "compute=slurm",
    "compute.nodes=2",
    "compute.procs_per_node=1",
    "compute.min_nodes=1",
    "compute.poll_interval_s=1",
    "dist=native",
    "data=custom",
    "data.target=ddlkit.testing.fakes:class_images",
    "+data.kwargs.numbered=true",
    "data.num_classes=4",
    "data.image_size=8",
    "trainer.batch_size=8",
    "trainer.epochs=2",
    "trainer.log_every=1",
    "trainer.checkpoint_every=2",
    "trainer.deterministic=true",
    "framework.allreduce=true",
    "framework.trace_samples=true",
    "restart.backoff_s=0",
)


def node_state(env: dict[str, str], state: str, *, check: bool = True) -> None:
    subprocess.run(
        [
            "scontrol",
            "update",
            f"NodeName={NODE_2}",
            f"State={state}",
            *(["Reason=lost in a test"] if state == "DRAIN" else []),
        ],
        env=env,
        check=check,
        timeout=30,
    )


def test_a_lost_node_shrinks_the_job_and_it_grows_back_when_the_node_returns(
    two_node_slurm: dict[str, str], tmp_path: Path
) -> None:
    env = {**two_node_slurm, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    straight = subprocess.run(
        [sys.executable, "-m", "ddlkit", *JOB, f"hydra.run.dir={tmp_path / 'straight'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]

    job_dir = tmp_path / "elastic"
    # the rank on node 2 (node index 1) kills itself before step 5
    errors = open(tmp_path / "stderr.txt", "w")  # the launcher's, closed when it ends
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            *JOB,
            "framework.kill_node=1",
            "framework.kill_at_step=5",
            "framework.step_delay_s=0.3",
            f"hydra.run.dir={job_dir}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    lines: list[str] = []
    training, shrunk = threading.Event(), threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            training.set() if line.startswith("train epoch") else None
            shrunk.set() if line.startswith("ddlkit: restart 1/3 on ") else None

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # node 2 fails while the job runs on it: Slurm gives it to no new job, and its rank dies
        assert training.wait(180), "".join(lines)[-3000:]
        node_state(env, "DRAIN")
        assert shrunk.wait(180), "".join(lines)[-3000:]
        # node 2 is back; once the job on node 1 has trained a little, a preemption notice stops it
        node_state(env, "RESUME")
        deadline = time.monotonic() + 120
        while (step_reached(job_dir) or 0) < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        first = worker_pids(job_dir)[0]  # a preemption notice to rank 0
        os.kill(first, signal.SIGTERM)
        proc.wait(timeout=300)  # the reader has stdout: communicate() would take lines from it
    finally:
        if proc.poll() is None:
            proc.kill()
        errors.close()
        node_state(env, "RESUME", check=False)  # whatever happened: a node that is up already says so
    reader.join(10)
    stderr = (tmp_path / "stderr.txt").read_text()
    stdout = "".join(lines)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    said = "".join(line for line in lines if line.startswith("ddlkit: restart"))

    assert (
        "ddlkit: restart 1/3 on 1 of 2 nodes (compute.min_nodes=1, 1 rank): trainer.on_resize=keep_global_batch: "
        "per-rank batch 8 -> 8 x 2 micro-batches, lr unchanged\n"
    ) in stdout
    assert (
        "ddlkit: restart 2/3 on 2 of 2 nodes (compute.min_nodes=1, 2 ranks): trainer.on_resize=keep_global_batch: "
        "per-rank batch 8 x 2 micro-batches -> 8, lr unchanged\n"
    ) in said, f"{said}\nSIGTERM to rank 0's worker {first}; the lines that name a restart:\n" + "".join(
        repr(line) + "\n" for line in lines if "restart" in line
    )
    first_restart, second_restart = restarts(job_dir)
    assert (first_restart["nodes"], first_restart["world_size"], second_restart["nodes"]) == (1, 1, 2)
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["world_size"]) == (32, 2, 2)
    assert_every_sample_once(job_dir, epochs=2, samples=256)
    assert verify(latest_checkpoint(job_dir)) is None
    np.testing.assert_allclose(
        np.load(job_dir / MODEL_FILE), np.load(tmp_path / "straight" / MODEL_FILE), rtol=0, atol=1e-12
    )
