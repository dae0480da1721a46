"""dist=fsdp end to end: real launchers, mpirun, 2 CPU ranks over gloo.

FSDP shards what DDP replicates, and computes the same thing: the same losses as dist=native step
for step, with accumulation and clipping too. Its checkpoints are sharded (DCP) and load into
another number of ranks; the reference for a resume on another world size is the same resume of
dist=native's plain checkpoint, which ddlkit already reshapes for an elastic job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ddlkit_mpi")

import torch

from ddlkit.testing import RunFactory
from ddlkit.testing.core import latest_checkpoint, verify
from ddlkit.testing.multirank import DistJobs, needs_mpirun

pytestmark = [pytest.mark.slow, needs_mpirun]

HERE = Path(__file__).parent
# fsdp_models.mlp: residual blocks of a class of the user's, no BatchNorm
TRAIN = [
    "framework=pytorch",
    "model=custom",
    "model.target=fsdp_models:mlp",
    "data.image_size=16",
    "data.num_classes=10",
    "data.length=256",
    "trainer.validate=false",
    "trainer.log_every=1",
    "trainer.save_model=true",
    "trainer.checkpoint_every=3",
    "trainer.deterministic=true",
    "framework.num_threads=1",
    "optimizer=adamw",
    "optimizer.lr=0.003",
    "optimizer.warmup_epochs=0",
]
TWO = ["compute=local_mpi", "compute.procs_per_node=2", "trainer.batch_size=8"]
ONE = ["trainer.batch_size=16"]  # the same global batch
FSDP = ["dist=fsdp", "framework.fsdp_blocks=[Block]"]


def losses(job_dir: Path) -> list[float]:
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return [m["loss"] for m in map(json.loads, lines) if m.get("split") == "train"]


def weights(job_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(job_dir / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> DistJobs:
    return DistJobs(tmp_path_factory.mktemp("fsdp"), path=[HERE])


@pytest.mark.parametrize(
    "more", [[], ["trainer.accumulate_batches=2", "trainer.clip_grad_norm=0.05"]], ids=["plain", "accumulate+clip"]
)
def test_fsdp_trains_as_native_does(jobs: DistJobs, more: list[str]) -> None:
    """10 steps of the same model, seed and data: the same losses to 1e-5, and model.pt is the
    plain full state dict (the names of the unsharded model), equal to native's."""
    name = "accumulate" if more else "plain"
    runs = {}
    for dist in (["dist=native"], FSDP):
        job_dir = jobs.base / f"{dist[0][5:]}-{name}"
        jobs.run(*TRAIN, *TWO, *dist, *more, "trainer.max_steps=10", job_dir=job_dir).assert_success()
        runs[dist[0]] = job_dir
    native, fsdp = (losses(runs[d]) for d in ("dist=native", "dist=fsdp"))
    assert len(native) == 10 and fsdp == pytest.approx(native, rel=1e-5)
    assert native[-1] < native[0] - 0.1  # it learned
    ours, theirs = weights(runs["dist=fsdp"]), weights(runs["dist=native"])
    assert ours.keys() == theirs.keys() and all(type(t) is torch.Tensor for t in ours.values())
    for key, tensor in theirs.items():
        torch.testing.assert_close(ours[key], tensor, rtol=1e-5, atol=1e-6, msg=key)
    checkpoint = latest_checkpoint(runs["dist=fsdp"])
    assert verify(checkpoint) is None
    assert sorted(p.name for p in checkpoint.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "extra.pt"]


def test_a_resume_on_as_many_ranks_is_bitwise(jobs: DistJobs) -> None:
    straight, resumed = jobs.base / "straight", jobs.base / "resumed"
    jobs.run(*TRAIN, *TWO, *FSDP, "trainer.max_steps=6", job_dir=straight).assert_success()
    jobs.run(*TRAIN, *TWO, *FSDP, "trainer.max_steps=3", job_dir=resumed).assert_success()
    jobs.run(*TRAIN, *TWO, *FSDP, "trainer.max_steps=6", job_dir=resumed).assert_success()
    assert losses(resumed) == losses(straight)
    ours, theirs = weights(resumed), weights(straight)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize(("before", "after"), [(TWO, ONE), (ONE, TWO)], ids=["2->1", "1->2"])
def test_a_resume_on_another_world_size_reshards(jobs: DistJobs, before: list[str], after: list[str]) -> None:
    """Steps 1-3 on one world size, 4-6 on the other: the same losses as native's resume of its
    plain checkpoint, i.e. the model and the optimizer's state came back whole from the shards."""
    out = {}
    for dist in (["dist=native"], FSDP):
        job_dir = jobs.base / f"{dist[0][5:]}-{len(before)}-to-{len(after)}"
        jobs.run(*TRAIN, *before, *dist, "trainer.max_steps=3", job_dir=job_dir).assert_success()
        outcome = jobs.run(*TRAIN, *after, *dist, "trainer.max_steps=6", job_dir=job_dir).assert_success()
        assert outcome.result["world_size"] == (2 if after is TWO else 1)
        assert "resumed from" in outcome.stdout
        out[dist[0]] = losses(job_dir)
    assert len(out["dist=fsdp"]) == 6 and out["dist=fsdp"] == pytest.approx(out["dist=native"], rel=1e-5)


def test_a_damaged_shard_falls_back_to_the_previous_checkpoint(jobs: DistJobs) -> None:
    job_dir = jobs.base / "damaged"
    jobs.run(*TRAIN, *TWO, *FSDP, "trainer.max_steps=6", "trainer.keep_checkpoints=2", job_dir=job_dir)
    latest = latest_checkpoint(job_dir)
    assert latest.name == "step-00000006.ckpt"
    shard = latest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    (job_dir / "model.pt").unlink()
    outcome = jobs.run(*TRAIN, *TWO, *FSDP, "trainer.max_steps=9", job_dir=job_dir).assert_success()
    said = outcome.stdout + outcome.stderr
    assert "step-00000006.ckpt" in said and "__1_0.distcp" in said  # named as damaged
    assert "resumed from" in outcome.stdout and "step-00000003.ckpt" in outcome.stdout
    assert outcome.result["steps"] == 9 and verify(latest_checkpoint(job_dir)) is None


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_tensorflow_and_keras_refuse_fsdp_in_one_line(run_factory: RunFactory, framework: str) -> None:
    pytest.importorskip(f"ddlkit_{framework}")
    run_factory(f"framework={framework}", "dist=fsdp", "trainer.max_steps=1").assert_one_line_error(
        f"framework={framework} does not train with dist=fsdp: use dist=native or dist=horovod."
    )
