"""dist=fsdp end to end: real launchers, mpirun, 2 CPU ranks over gloo.

FSDP shards what DDP replicates, and computes the same thing: the same losses as dist=native step
for step, with accumulation and clipping too. Its checkpoints are sharded (DCP) and load into
another number of ranks; the reference for a resume on another world size is the same resume of
dist=native's plain checkpoint, which ddlkit already reshapes for an elastic job.
"""

from __future__ import annotations

import json
import re
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
BLOCKS = "framework.fsdp_blocks=[Block]"
FSDP = ["dist=fsdp", BLOCKS]


def losses(job_dir: Path) -> list[float]:
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return [m["loss"] for m in map(json.loads, lines) if m.get("split") == "train"]


def weights(job_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(job_dir / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> DistJobs:
    return DistJobs(tmp_path_factory.mktemp("fsdp"), path=[HERE])


@pytest.mark.parametrize(
    ("name", "more"),
    [
        ("plain", []),
        # activations recomputed in the backward pass are the same activations: the same losses
        (
            "accumulate-clip-recompute",
            [
                "trainer.accumulate_batches=2",
                "trainer.clip_grad_norm=0.05",
                "framework.activation_checkpointing=true",
                BLOCKS,
            ],
        ),
    ],
)
def test_fsdp_trains_as_native_does(jobs: DistJobs, name: str, more: list[str]) -> None:
    """10 steps of the same model, seed and data: the same losses to 1e-5, and model.pt is the
    plain full state dict (the names of the unsharded model), equal to native's."""
    runs = {}
    for dist in (["dist=native"], ["dist=fsdp"] if BLOCKS in more else FSDP):
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


def test_a_resume_on_another_world_size_reshards(jobs: DistJobs) -> None:
    """Steps 1-3 on 2 ranks, 4-6 on 1, 7-9 on 2 again: the same losses as native's resumes of its
    plain checkpoints, i.e. the model and the optimizer's state came back whole from the shards."""
    out = {}
    for dist in (["dist=native"], FSDP):
        job_dir = jobs.base / f"{dist[0][5:]}-2-1-2"
        for ranks, steps in ((TWO, 3), (ONE, 6), (TWO, 9)):
            outcome = jobs.run(*TRAIN, *ranks, *dist, f"trainer.max_steps={steps}", job_dir=job_dir).assert_success()
            assert outcome.result["world_size"] == (2 if ranks is TWO else 1)
        assert outcome.result["resumed_from_step"] == 6
        out[dist[0]] = losses(job_dir)
    assert len(out["dist=fsdp"]) == 9 and out["dist=fsdp"] == pytest.approx(out["dist=native"], rel=1e-5)


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


def test_a_shard_write_that_fails_once_is_written_again(jobs: DistJobs) -> None:
    """One rank's part of the step-3 checkpoint fails once (a value of the model's state that will
    not pickle the first time): every rank hears it from DCP, the write is taken again, and the
    checkpoint is whole; the run goes on as one that never failed."""
    marker = jobs.base / "fail-once"
    marker.touch()
    job = [arg for arg in TRAIN if not arg.startswith(("model.target", "trainer.save_model"))]
    # trainer.save_model=false: model.pt's gather takes tensors only, and the model's state holds that value
    model = ["model.target=fsdp_models:mlp_failing_once", f"+model.kwargs.marker={marker}", "trainer.save_model=false"]
    outcome = jobs.run(*job, *model, *TWO, *FSDP, "trainer.max_steps=4", job_dir=jobs.base / "again")
    outcome.assert_success()
    assert not marker.exists()  # the failure happened
    said = (jobs.base / "again" / "rank-0.log").read_text()
    warning = r"ddlkit: warning: writing checkpoint step-00000003\.ckpt failed on rank\(s\) (\d) \(rank \1: OSError: "
    assert re.search(warning + r"a write that fails once \(test: .*\)\); writing it again", said), said
    for step in (3, 4):
        assert verify(jobs.base / "again" / "checkpoints" / f"step-{step:08d}.ckpt") is None


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_tensorflow_and_keras_refuse_fsdp_in_one_line(run_factory: RunFactory, framework: str) -> None:
    pytest.importorskip(f"ddlkit_{framework}")
    run_factory(f"framework={framework}", "dist=fsdp", "trainer.max_steps=1").assert_one_line_error(
        f"framework={framework} does not train with dist=fsdp: use dist=native or dist=horovod."
    )


def test_vit_l_16_trains_on_two_ranks_holding_half_the_model_state(jobs: DistJobs) -> None:
    """ViT-L/16 (304 M parameters) with AdamW: replicated, each rank holds 16 bytes per parameter
    of model state (4.5 GiB: weights, gradients, two moments); sharded over 2 ranks, half of that
    (result.json's model_state_mib). The process's peak RSS also holds what is not model state
    (the interpreter and torch, activations, the checkpoint write's copies). With glibc's malloc
    returning the blocks sharding frees (framework.fsdp_mmap_threshold_mib=1): measured 2.9 GiB
    against 5.1 GiB (0.57x), asserted loosely; 3.75 GiB (0.73x) with malloc as it is."""
    vit = [
        "framework=pytorch",
        "model=vit_l_16",
        "data.image_size=32",
        "data.num_classes=10",
        "optimizer=adamw",
        "trainer.max_steps=2",
        "trainer.validate=false",
        "trainer.save_model=false",
        "framework.num_threads=1",
        *TWO,
    ]
    results = {}
    for dist, extra in (("native", []), ("fsdp", ["framework.fsdp_mmap_threshold_mib=1"])):
        job_dir = jobs.base / f"vit-l-{dist}"
        outcome = jobs.run(*vit, f"dist={dist}", *extra, job_dir=job_dir, timeout=900).assert_success()
        results[dist] = outcome.result
    state = {d: r["model_state_mib"] for d, r in results.items()}
    peak = {d: r["peak_memory_mib"] for d, r in results.items()}
    assert state["native"] == pytest.approx(304_326_632 * 16 / 2**20, rel=0.01), state
    assert state["fsdp"] <= 0.51 * state["native"], state
    assert peak["native"] > state["native"] and peak["fsdp"] < 0.65 * peak["native"], peak
