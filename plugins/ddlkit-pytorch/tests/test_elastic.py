"""An elastic PyTorch job under mpirun (issue 27): 2 simulated nodes of 1 rank, DDP over gloo; node 1
is lost for good (marked down, its rank killed with SIGKILL), the job goes on on node 0, where
keeping the global batch makes the rank accumulate 2 micro-batches per step -- and ends with the
weights of a job that never lost a node (a float64 model: the two sum the same gradients). Its final
checkpoint verifies and its steps add up."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")
pytest.importorskip("ddlkit_mpi")

import torch

from ddlkit.compute.restarts import step_reached
from ddlkit.jobdir import NODE_DOWN
from ddlkit.testing.core import latest_checkpoint, verify
from ddlkit.testing.multirank import DistJobs, needs_mpirun, read_lines_until, worker_pids

pytestmark = [pytest.mark.slow, needs_mpirun]

MODULE = textwrap.dedent("""\
    import time

    import torch

    class Linear(torch.nn.Module):
        # a float64 softmax regression on the flattened images
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8 * 8 * 3, 4, dtype=torch.float64)

        def forward(self, x):
            return self.fc(x.double().flatten(1))

    class Slow:
        # a step a test can catch
        def on_step_end(self, run, step, metrics):
            time.sleep(0.2)

    class SlowLinear(Linear):
        # a step a test can catch, spent in the forward pass: a rank killed meanwhile fails the
        # others in the gradients' all-reduce (gloo), not in ddlkit's own collectives
        def forward(self, x):
            time.sleep(0.2)
            return super().forward(x)
    """)

# 2 nodes x 1 rank x 8 = a global batch of 16: 16 steps per epoch of 256 samples
JOB = (
    "framework=pytorch",
    "model=custom",
    "model.target=elastic_model:Linear",
    "data=custom",
    "data.target=ddlkit.testing.fakes:class_images",
    "data.num_classes=4",
    "data.image_size=8",
    "optimizer=sgd",
    "optimizer.lr=0.1",
    "optimizer.warmup_epochs=0",
    "trainer.epochs=2",
    "trainer.batch_size=8",
    "trainer.checkpoint_every=2",
    "trainer.log_every=1",
    "trainer.deterministic=true",
    "trainer.validate=false",
    "framework.num_threads=1",
    "compute=local_mpi",
    "compute.nodes=2",
    "compute.procs_per_node=1",
    "compute.min_nodes=1",
    "dist=native",
    "restart.backoff_s=0",
    "logger=[console]",
)


@pytest.mark.parametrize("dist", ["native", "fsdp"])
def test_a_pytorch_job_that_loses_a_node_goes_on_with_the_global_batch_and_its_weights(
    tmp_path: Path, dist: str
) -> None:
    """With dist=fsdp the survivor resumes from a checkpoint sharded over 2 ranks: loaded by
    resharding onto 1 (issue 41)."""
    jobs = DistJobs(tmp_path)
    (tmp_path / "elastic_model.py").write_text(MODULE)
    job = (*(arg for arg in JOB if not arg.startswith("dist=")), f"dist={dist}")
    jobs.run(*job, job_dir=tmp_path / "straight").assert_success()

    job_dir = tmp_path / "elastic"
    launcher = jobs.start(*job, "trainer.callbacks=[elastic_model:Slow]", job_dir=job_dir)
    try:
        read_lines_until(launcher, "step 5/", timeout=180)
        # node 1 is lost for good: marked down, then its rank killed
        (job_dir / "nodes" / "node-1" / NODE_DOWN).touch()
        os.kill(worker_pids(job_dir)[1], signal.SIGKILL)
        output, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-4000:]
    assert "trainer.on_resize=keep_global_batch: per-rank batch 8 -> 8 x 2 micro-batches, lr unchanged" in output, (
        output[-4000:]
    )
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["world_size"], result["accumulate_batches"]) == (32, 1, 1, 2)
    assert result["resize"]["planned_world_size"] == 2
    assert verify(latest_checkpoint(job_dir)) is None
    lost = result["steps_lost"]
    assert step_reached(job_dir) == 32 and 0 <= lost <= 2
    straight = torch.load(tmp_path / "straight" / "model.pt", weights_only=True)
    shrunk = torch.load(job_dir / "model.pt", weights_only=True)
    for name in ("fc.weight", "fc.bias"):
        np.testing.assert_allclose(shrunk[name].numpy(), straight[name].numpy(), rtol=0, atol=1e-12)


def test_a_node_lost_with_everything_on_it_restarts_the_pytorch_job(tmp_path: Path) -> None:
    """A node that goes away takes its rank minder along: no exit record says how its rank ended, and
    the other rank's gloo all-reduce fails with ``Connection closed by peer``, which names no rank and
    reads like an error of the job's own. The survivor says that a rank left (its process ended), so
    the job is restarted (it was ended as the job's own error, not restarted) and ends as one that
    never lost a node."""
    jobs = DistJobs(tmp_path)
    (tmp_path / "elastic_model.py").write_text(MODULE)
    fixed = [arg for arg in JOB if not arg.startswith("compute.min_nodes")]
    jobs.run(*fixed, job_dir=tmp_path / "straight").assert_success()

    job_dir = tmp_path / "lost"
    launcher = jobs.start(*fixed, "model.target=elastic_model:SlowLinear", job_dir=job_dir)
    try:
        read_lines_until(launcher, "step 5/", timeout=180)
        worker = worker_pids(job_dir)[1]
        minder = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
        os.kill(minder, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)
        output, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-4000:]
    assert "ddlkit: restart 1/3: a rank was lost (it left, went silent or never joined); " in output, output[-4000:]
    assert "RankLostError: rank 1 left the job (its process ended) while this rank trained" in output
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["world_size"]) == (32, 1, 2)
    assert verify(latest_checkpoint(job_dir)) is None
    straight = torch.load(tmp_path / "straight" / "model.pt", weights_only=True)
    resumed = torch.load(job_dir / "model.pt", weights_only=True)
    for name in ("fc.weight", "fc.bias"):
        assert torch.equal(resumed[name], straight[name]), name
