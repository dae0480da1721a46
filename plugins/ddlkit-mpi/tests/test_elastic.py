"""Elastic world size on compute=local_mpi (issue 27): real ranks under mpirun on 2 simulated nodes of
2 ranks; every rank of node 1 is killed with SIGKILL and the node marked down (a node lost that does
not come back), the job restarts on the node that remains, and grows back to both once node 1
returns and the job restarts again (a preemption notice, SIGTERM to a rank). Nothing may be lost:
the final checkpoint verifies, the steps add up, every sample of every epoch is trained on exactly
once (the ranks trace the samples they read), and keeping the global batch ends with the weights of a
job that never lost a node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ddlkit.compute.restarts import step_reached
from ddlkit.jobdir import NODE_DOWN
from ddlkit.testing.core import latest_checkpoint, verify
from ddlkit.testing.elastic import assert_every_sample_once, restarts
from ddlkit.testing.fakes import MODEL_FILE
from ddlkit.testing.multirank import worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun")]

# 2 nodes x 2 ranks, a global batch of 32 (8 per rank): 8 steps per epoch of 256 numbered samples;
# gradients averaged over the ranks, as a real framework does
JOB = (
    "framework=fake",
    "compute=local_mpi",
    "compute.nodes=2",
    "compute.procs_per_node=2",
    "dist=native",
    "data=custom",
    "data.target=ddlkit.testing.fakes:class_images",
    "+data.kwargs.numbered=true",
    "data.num_classes=4",
    "data.image_size=8",
    "trainer.batch_size=8",
    "trainer.log_every=1",
    "trainer.checkpoint_every=2",
    "trainer.deterministic=true",
    "framework.allreduce=true",
    "framework.trace_samples=true",
    "restart.backoff_s=0",
)
ELASTIC = ("compute.min_nodes=1",)
#: every rank of node 1 marks it down and kills itself before step 5
LOSE_NODE_1 = ("framework.kill_node=1", "framework.kill_at_step=5")


def command(tmp_path: Path, job: str, *overrides: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    return [sys.executable, "-m", "ddlkit", *JOB, *overrides, f"hydra.run.dir={tmp_path / job}"], env


def ddlkit(tmp_path: Path, job: str, *overrides: str) -> subprocess.CompletedProcess:
    args, env = command(tmp_path, job, *overrides)
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_lost_node_shrinks_the_job_to_the_nodes_left_and_it_grows_back_when_the_node_returns(tmp_path: Path) -> None:
    straight = ddlkit(tmp_path, "straight", "trainer.epochs=3")
    assert straight.returncode == 0, straight.stderr

    job_dir = tmp_path / "elastic"
    args, env = command(tmp_path, "elastic", "trainer.epochs=3", *ELASTIC, *LOSE_NODE_1, "framework.step_delay_s=0.3")
    errors = open(tmp_path / "stderr.txt", "w")  # the launcher's, closed when it ends
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
    lines: list[str] = []
    shrunk = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ddlkit: restart 1/3 on "):
                shrunk.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert shrunk.wait(180), "".join(lines)[-3000:]
        # node 1 returns; once the job on node 0 has trained a little, a preemption notice ends it
        (job_dir / "nodes" / "node-1" / NODE_DOWN).unlink()
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
    reader.join(10)
    stderr = (tmp_path / "stderr.txt").read_text()
    stdout = "".join(lines)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    said = "".join(line for line in lines if line.startswith("ddlkit: restart"))

    # said on the console: where each restart runs and what that does to the batch and the learning rate
    assert (
        "ddlkit: restart 1/3 on 1 of 2 nodes (compute.min_nodes=1, 2 ranks): trainer.on_resize=keep_global_batch: "
        "per-rank batch 8 -> 8 x 2 micro-batches, lr unchanged\n"
    ) in stdout
    assert (
        "ddlkit: 2 ranks instead of the planned 4: trainer.on_resize=keep_global_batch: per-rank batch 8 -> "
        "8 x 2 micro-batches, lr unchanged\n"
    ) in stdout
    assert (
        "ddlkit: restart 2/3 on 2 of 2 nodes (compute.min_nodes=1, 4 ranks): trainer.on_resize=keep_global_batch: "
        "per-rank batch 8 x 2 micro-batches -> 8, lr unchanged\n"
    ) in said, said
    # and in the job's record
    first_restart, second_restart = restarts(job_dir)
    assert (first_restart["nodes"], first_restart["world_size"], first_restart["resumed_from"]) == (1, 2, 4)
    assert (second_restart["nodes"], second_restart["world_size"]) == (2, 4)
    # nothing lost: the steps add up, each epoch trained every sample once, the final checkpoint verifies,
    # and the weights are those of the job that never lost a node (the same global batches, in order)
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["world_size"], result["resize"]) == (24, 2, 4, None)
    assert_every_sample_once(job_dir, epochs=3, samples=256)
    assert verify(latest_checkpoint(job_dir)) is None
    np.testing.assert_allclose(
        np.load(job_dir / MODEL_FILE), np.load(tmp_path / "straight" / MODEL_FILE), rtol=0, atol=1e-12
    )


def test_scale_lr_keeps_the_per_rank_batch_and_goes_on_at_the_same_sample(tmp_path: Path) -> None:
    shrunk = ddlkit(tmp_path, "scaled", "trainer.epochs=2", *ELASTIC, *LOSE_NODE_1, "trainer.on_resize=scale_lr")
    assert shrunk.returncode == 0, shrunk.stdout[-3000:] + shrunk.stderr[-3000:]
    # the global batch halves, and the learning rate with it (Goyal et al.'s linear rule for SGD)
    assert (
        "ddlkit: restart 1/3 on 1 of 2 nodes (compute.min_nodes=1, 2 ranks): trainer.on_resize=scale_lr: "
        "per-rank batch 8, global batch 32 -> 16, lr 0.0125 -> 0.00625 (optimizer.scale_lr=linear)\n"
    ) in shrunk.stdout
    # 4 steps of 32 samples were taken: the job goes on at sample 128 of epoch 0, step 8 of 16 steps of 16
    assert "ddlkit: resuming 128 images into epoch 0: at its step 8 of 16 (global batch 32 -> 16)\n" in shrunk.stdout
    job_dir = tmp_path / "scaled"
    result = json.loads((job_dir / "result.json").read_text())
    # 4 steps of 32, then the rest of epoch 0 (8 steps of 16) and epoch 1 (16 steps of 16)
    assert (result["steps"], result["steps_per_epoch"], result["global_batch_size"]) == (4 + 8 + 16, 16, 16)
    assert result["resize"]["on_resize"] == "scale_lr" and result["peak_lr"] == pytest.approx(0.1 * 16 / 256)
    assert_every_sample_once(job_dir, epochs=2, samples=256)
    assert verify(latest_checkpoint(job_dir)) is None
    # ddlkit jobs status says it too
    status = subprocess.run(
        [sys.executable, "-m", "ddlkit", "jobs", "status", str(job_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"},
    )
    assert (
        "resubmitted on 1 of 2 nodes, resuming from step 4 (0 steps lost); trainer.on_resize=scale_lr: per-rank "
        "batch 8, global batch 32 -> 16, lr 0.0125 -> 0.00625 (optimizer.scale_lr=linear)\n"
    ) in status.stdout, status.stdout + status.stderr


def test_fewer_nodes_up_than_min_nodes_end_the_job_and_say_so(tmp_path: Path) -> None:
    # 3 nodes of 1 rank, at least 2: node 2 is down from the start (its ranks run all the same, as the
    # launcher asks only at a restart), node 1 is lost at step 5 -- one node is left
    (tmp_path / "short" / "nodes" / "node-2").mkdir(parents=True)
    (tmp_path / "short" / "nodes" / "node-2" / NODE_DOWN).touch()
    failed = ddlkit(
        tmp_path,
        "short",
        "trainer.epochs=1",
        "compute.nodes=3",
        "compute.procs_per_node=1",
        "compute.min_nodes=2",
        "trainer.batch_size=4",
        "+data.kwargs.n=240",
        *LOSE_NODE_1,
    )
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    # local_mpi's simulated nodes come back only by hand: by default a restart does not wait for them
    error = failed.stderr.strip().splitlines()[-1]
    assert (
        error.startswith("ddlkit: error: job ")
        and (
            "not restarted: only 1 of its 3 nodes are up on compute=local_mpi, fewer than compute.min_nodes=2, and "
            "restart.capacity_wait_s=0 waits for none: bring nodes back or add some, lower compute.min_nodes, or let a "
            "restart wait for them (restart.capacity_wait_s=600); it resumes from step 4 when run again: resume with: "
            "ddlkit "
        )
        in error
    ), failed.stderr[-3000:]


def test_a_global_batch_that_cannot_be_kept_on_fewer_nodes_is_refused_before_the_job_starts(tmp_path: Path) -> None:
    # 3 nodes x 2 ranks x 5 = a global batch of 30, which does not split over 2 nodes x 2 ranks
    refused = ddlkit(
        tmp_path,
        "refused",
        "compute.nodes=3",
        "compute.procs_per_node=2",
        "compute.min_nodes=2",
        "trainer.batch_size=5",
    )
    assert refused.returncode == 2, refused.stderr
    assert (
        "compute.min_nodes=2: on 2 node(s) of 2 rank(s), trainer.on_resize=keep_global_batch cannot keep the "
        "global batch of 30 on 4 ranks"
    ) in refused.stderr
    assert not (tmp_path / "refused" / "result.json").exists()


def test_a_sweeps_elastic_job_goes_on_with_the_nodes_left(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "-m",
            *JOB,
            "trainer.epochs=1",
            *ELASTIC,
            *LOSE_NODE_1,
            "optimizer.lr=0.1,0.2",
            "sweep.max_parallel=1",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for job in (0, 1):
        assert (
            f"ddlkit: sweep job #{job} restart 1/3 on 1 of 2 nodes (compute.min_nodes=1, 2 ranks): "
            "trainer.on_resize=keep_global_batch: per-rank batch 8 -> 8 x 2 micro-batches, lr unchanged\n"
        ) in proc.stdout, proc.stdout[-3000:]
        job_dir = sweep_dir / str(job)
        result = json.loads((job_dir / "result.json").read_text())
        assert (result["steps"], result["restarts"], result["world_size"]) == (8, 1, 2)
        assert_every_sample_once(job_dir, epochs=1, samples=256)
        assert verify(latest_checkpoint(job_dir)) is None


def test_a_sweeps_job_waits_for_capacity_and_goes_on_when_the_node_returns(tmp_path: Path) -> None:
    # 2 nodes, both needed (compute.min_nodes=2): node 1 is lost at step 5; the restart waits for
    # capacity between the sweep's looks at its jobs, node 1 comes back, the job completes on both
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "-m",
            *JOB,
            "trainer.epochs=1",
            "compute.min_nodes=2",
            *LOSE_NODE_1,
            "restart.capacity_wait_s=120",
            "optimizer.lr=0.1",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if " waits for capacity: " in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert waiting.wait(180), "".join(lines)[-3000:]
        (sweep_dir / "0" / "nodes" / "node-1" / NODE_DOWN).unlink()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert (
        "ddlkit: sweep job #0 restart 1/3 waits for capacity: only 1 of its 2 nodes are up on compute=local_mpi, "
        "fewer than compute.min_nodes=2; looking again every 1 s for up to "
    ) in out, out[-3000:]
    assert "ddlkit: sweep job #0 restart 1/3 on its 2 nodes after waiting " in out, out[-3000:]
    result = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["world_size"]) == (8, 1, 4)  # 2 nodes x 2 ranks
    assert verify(latest_checkpoint(sweep_dir / "0")) is None
