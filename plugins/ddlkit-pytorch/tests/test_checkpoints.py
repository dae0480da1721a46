"""framework=pytorch checkpoints that cannot be trusted (issue 17, items 6 and 7), through the
real CLI: a truncated latest ``.ckpt`` is passed over by name for the newest intact one, and a
disk that fills up while ``torch.save`` writes (PyTorch says only ``RuntimeError: ... unexpected
pos ...``) is reported as such, with the previous checkpoint kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlkit.testing.core import verify

pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

pytestmark = pytest.mark.slow

# ResNet-18 at 32 px, 4 steps per epoch, 2 epochs: checkpoints at steps 4 (epoch end) and 6 (max_steps)
COMMON = [
    "framework=pytorch",
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=64",
    "data.val_length=16",
    "trainer.batch_size=16",
    "trainer.epochs=2",
    "trainer.log_every=2",
    "trainer.warmup_steps=1",
    "framework.num_threads=1",
]


def ddlkit(job_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDLKIT_STATE_DIR": str(job_dir.parent / ".ddlkit-state")}
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *COMMON, *overrides, f"hydra.run.dir={job_dir}"],
        cwd=job_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """The job's checkpoint directory on a 140 MB file system of its own: room for one ResNet-18
    checkpoint (~90 MB with its momentum buffers), not two."""
    directory = tmp_path / "job" / "checkpoints"
    directory.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill up needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=140m", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield directory
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def test_a_truncated_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path: Path) -> None:
    job = tmp_path / "job"
    ok(ddlkit(job, "trainer.max_steps=6"))
    ckdir = job / "checkpoints"
    bad = ckdir / "step-00000006.ckpt"
    assert (ckdir / "latest").read_text() == f"{bad.name}\n" and verify(bad) is None
    size = bad.stat().st_size
    with open(bad, "r+b") as f:
        f.truncate(size - 4096)  # a torch.load of it: "PytorchStreamReader failed reading zip archive"
    out = ok(ddlkit(job))  # the command a stopped job prints to resume it
    shown = out.stdout + out.stderr
    assert (
        f"checkpoint {bad} is damaged: step-00000006.ckpt is {size - 4096} bytes, {size} were written "
        "(truncated); skipped"
    ) in shown
    assert f"resuming from {ckdir}/step-00000004.ckpt, the newest intact checkpoint" in shown
    assert "Traceback" not in shown
    result = json.loads((job / "result.json").read_text())
    assert (result["resumed_from_step"], result["steps"]) == (4, 8)
    assert (ckdir / "latest").read_text() == "step-00000008.ckpt\n" and verify(ckdir / "step-00000008.ckpt") is None


def test_a_full_disk_while_torch_saves_keeps_the_previous_checkpoint(tmp_path: Path, tmpfs: Path) -> None:
    job = tmp_path / "job"
    out = ddlkit(job, "trainer.max_steps=6")
    shown = out.stdout + out.stderr
    assert out.returncode != 0, shown
    assert (
        f"no space left on {tmpfs} while writing checkpoint step 6; the previous checkpoint "
        f"{tmpfs}/step-00000004.ckpt is intact"
    ) in shown, shown
    assert "unexpected pos" not in shown and "Traceback" not in shown
    assert (tmpfs / "latest").read_text() == "step-00000004.ckpt\n"
    assert verify(tmpfs / "step-00000004.ckpt") is None
    assert not [p.name for p in tmpfs.iterdir() if p.name.endswith(".tmp")]


def test_a_checkpoint_written_in_the_background_is_the_one_written_at_once(tmp_path: Path) -> None:
    """trainer.checkpoint_async (the default): the checkpoints of steps 2 and 4, written while
    the next steps train, hold the bytes a write on the training thread gives."""
    run = ("trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.deterministic=true")
    background = ok(ddlkit(tmp_path / "background", *run))
    at_once = ok(ddlkit(tmp_path / "at-once", *run, "trainer.checkpoint_async=false"))
    assert background.returncode == at_once.returncode == 0
    for step in (4, 6):
        name = f"checkpoints/step-0000000{step}.ckpt"
        assert verify(tmp_path / "background" / name) is None
        assert (tmp_path / "background" / name).read_bytes() == (tmp_path / "at-once" / name).read_bytes(), name
