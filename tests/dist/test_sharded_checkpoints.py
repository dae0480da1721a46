"""Sharded checkpoints (``Run.checkpointing(sharded=True)``, what dist=fsdp uses), driven by the
fake framework, whose dist=fsdp writes each rank's rows of the weights as its part: every rank
writes into the temporary directory all ranks name alike, rank 0 completes the checkpoint
(manifest, rename, ``latest``), in the background as well as on the training thread; a rank
lost halfway leaves no checkpoint, only a temporary directory the next start removes; a
checkpoint of 2 ranks resumes on 1 and on 3."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddlkit.checkpoint import read_manifest
from ddlkit.testing import wait_for
from ddlkit.testing.core import latest_checkpoint, verify

pytestmark = pytest.mark.slow

SHARDED = [
    "framework=fake",
    "compute=local_mpi",
    "dist=fsdp",
    "data.image_size=8",
    "data.num_classes=12",
    "data.length=96",
    "trainer.batch_size=4",
    "trainer.validate=false",
    "trainer.checkpoint_every=2",
    "trainer.keep_checkpoints=2",
]


def ranks(n: int) -> str:
    return f"compute.procs_per_node={n}"


@pytest.mark.parametrize("background", [True, False], ids=["background", "synchronous"])
def test_every_rank_writes_its_part_and_rank_0_completes_the_checkpoint(
    tmp_path: Path, dt: SimpleNamespace, background: bool
) -> None:
    job_dir = tmp_path / "job"
    outcome = dt.DistJobs(tmp_path).run(
        *SHARDED, ranks(2), "trainer.max_steps=6", f"trainer.checkpoint_async={background}", job_dir=job_dir
    )
    outcome.assert_success()
    checkpoints = sorted(p.name for p in (job_dir / "checkpoints").iterdir())
    # the two newest kept, each with its manifest; no temporary directory left
    assert checkpoints == [
        "latest",
        "step-00000004.ckpt",
        "step-00000004.ckpt.manifest.json",
        "step-00000006.ckpt",
        "step-00000006.ckpt.manifest.json",
    ]
    latest = latest_checkpoint(job_dir)
    assert latest.name == "step-00000006.ckpt" and verify(latest) is None
    manifest = read_manifest(latest)
    assert manifest is not None and manifest["kind"] == "directory"
    assert {"meta.json", "part-0.npz", "part-1.npz"} <= set(manifest["files"])
    assert json.loads((latest / "meta.json").read_text())["state"]["step"] == 6


@pytest.mark.parametrize("world", [1, 3])
def test_a_checkpoint_of_two_ranks_resumes_on_another_number(tmp_path: Path, dt: SimpleNamespace, world: int) -> None:
    jobs, job_dir = dt.DistJobs(tmp_path), tmp_path / "job"
    jobs.run(*SHARDED, ranks(2), "trainer.max_steps=6", job_dir=job_dir).assert_success()
    # 1 rank: the same global batch of 8; 3 ranks: 4 each, a global batch of 12
    batch = "trainer.batch_size=8" if world == 1 else "trainer.batch_size=4"
    resumed = jobs.run(*SHARDED, ranks(world), batch, "trainer.max_steps=10", job_dir=job_dir)
    resumed.assert_success()
    assert resumed.result["world_size"] == world and resumed.result["resumed_from_step"] == 6
    latest = latest_checkpoint(job_dir)
    assert verify(latest) is None
    assert sorted(p.name for p in latest.glob("part-*.npz")) == [f"part-{r}.npz" for r in range(world)]


def test_a_rank_killed_while_writing_its_part_leaves_no_checkpoint_and_the_next_start_cleans_up(
    tmp_path: Path, dt: SimpleNamespace
) -> None:
    """Rank 1 dies before its part of the first checkpoint is written: no checkpoint comes to be
    (no ``latest``), only the temporary directory, which the next start removes."""
    jobs, job_dir = dt.DistJobs(tmp_path), tmp_path / "job"
    launcher = jobs.start(
        *SHARDED,
        ranks(2),
        "trainer.max_steps=8",
        "trainer.checkpoint_async=false",
        "framework.save_delay_s=30",  # each write sleeps before it writes: time to kill rank 1 in it
        "restart.max_restarts=0",
        job_dir=job_dir,
    )
    dt.read_lines_until(launcher, "first step done", timeout=120)
    partial = job_dir / "checkpoints" / ".step-00000002.ckpt.shards.tmp"
    wait_for(partial.is_dir, "the ranks to start writing step 2", timeout=60, process=launcher)
    os.kill(dt.worker_pids(job_dir)[1], signal.SIGKILL)
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode != 0, output
    assert not (job_dir / "checkpoints" / "latest").exists() and partial.is_dir()
    resumed = jobs.run(*SHARDED, ranks(2), "trainer.max_steps=4", job_dir=job_dir)
    resumed.assert_success()
    assert not partial.exists()
    assert verify(latest_checkpoint(job_dir)) is None
