"""``trainer.profile`` with ``framework=pytorch`` (issue 42, item 4): real ``torch.profiler`` traces
through the real CLI, one per rank, holding the window's steps and no other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit.testing import RunFactory
from ddlkit.testing.multirank import needs_mpirun

pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

pytestmark = pytest.mark.slow

# tiny but real: ResNet-18 at 32 px, 8 steps, one thread
TINY = [
    "framework=pytorch",
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=128",
    "trainer.batch_size=8",
    "trainer.max_steps=6",
    "trainer.validate=false",
    "trainer.save_model=false",
    "framework.num_threads=1",
]
WINDOW = ["trainer.profile.start_step=3", "trainer.profile.num_steps=2"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """A working directory of its own, the environment restored."""


def traces(job_dir: Path) -> dict[str, Path]:
    """The job's trace files by rank (``rank0``), where the plugin writes them."""
    found = sorted((job_dir / "profile" / "plugins" / "profile" / "steps_3-4").glob("*.pt.trace.json"))
    return {path.name.split(".")[0]: path for path in found}


def profiled_steps(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})


def test_a_trace_of_the_window_and_nothing_when_off(tmp_path: Path) -> None:
    runs = RunFactory(tmp_path)
    on = runs(*TINY, *WINDOW).assert_success()
    assert on.result["status"] == "completed" and on.result["steps"] == 6
    assert on.job_dir is not None
    files = traces(on.job_dir)
    assert list(files) == ["rank0"], sorted(on.job_dir.rglob("*"))
    assert profiled_steps(files["rank0"]) == ["ProfilerStep#3", "ProfilerStep#4"]
    # the model's work is in it: convolutions of the forward and backward passes
    names = {e.get("name") for e in json.loads(files["rank0"].read_text())["traceEvents"]}
    assert {"aten::convolution", "aten::convolution_backward"} <= names
    assert (
        "ddlkit: profile of steps 3-4 written to profile/ (open with TensorBoard's profile plugin or "
        "https://ui.perfetto.dev)" in on.stdout
    )

    off = runs(*TINY).assert_success()
    assert off.job_dir is not None and not (off.job_dir / "profile").exists()


@needs_mpirun
def test_every_rank_writes_its_own_trace(tmp_path: Path) -> None:
    pytest.importorskip("ddlkit_mpi")
    outcome = RunFactory(tmp_path)(
        *TINY, *WINDOW, "compute=local_mpi", "compute.procs_per_node=2", "dist=native", timeout=300
    ).assert_success()
    assert outcome.job_dir is not None
    files = traces(outcome.job_dir)
    assert list(files) == ["rank0", "rank1"], sorted(outcome.job_dir.rglob("*"))
    for trace in files.values():
        assert profiled_steps(trace) == ["ProfilerStep#3", "ProfilerStep#4"]
    # rank 0 says it once
    assert outcome.stdout.count("ddlkit: profile of steps 3-4 written") == 1
