"""``trainer.profile`` with ``framework=tensorflow`` and ``framework=keras`` (issue 42, item 4):
TensorFlow's profiler, which both plugins use, through the real CLI writes its ``.xplane.pb`` under
the job directory's ``profile/``, in TensorBoard's layout, with the window's steps as step traces
(Keras's fit reports them through its callback)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ddlkit.testing import RunFactory

# the traces are read here (TensorFlow's protobuf of them): imported before the tests, which check
# that none of them changes the environment, and TensorFlow's import sets variables
xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")

pytestmark = pytest.mark.slow

TINY = [
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=64",
    "trainer.batch_size=8",
    "trainer.max_steps=5",
    "trainer.validate=false",
    "trainer.save_model=false",
]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """A working directory of its own, the environment restored."""


def traced_steps(xplane: Path) -> list[int]:
    """The ``step_num`` of every ``train`` step trace in an ``.xplane.pb``."""
    space = xplane_pb2.XSpace()
    space.ParseFromString(xplane.read_bytes())
    steps = set()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                if plane.event_metadata[event.metadata_id].name != "train":
                    continue
                for stat in event.stats:
                    if plane.stat_metadata[stat.metadata_id].name == "step_num":
                        steps.add(stat.int64_value or stat.uint64_value)
    return sorted(steps)


@pytest.mark.parametrize(
    "framework",
    [
        "tensorflow",
        pytest.param(
            "keras",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("ddlkit_keras") is None, reason="the ddlkit-keras plugin is not installed"
            ),
        ),
    ],
)
def test_the_profile_of_the_window_in_tensorboards_layout(tmp_path: Path, framework: str) -> None:
    outcome = RunFactory(tmp_path)(
        f"framework={framework}", *TINY, "trainer.profile.start_step=2", "trainer.profile.num_steps=2", timeout=300
    ).assert_success()
    assert outcome.result["status"] == "completed" and outcome.job_dir is not None
    found = list((outcome.job_dir / "profile").rglob("*.xplane.pb"))
    assert len(found) == 1, sorted(outcome.job_dir.rglob("*"))
    # <job dir>/profile/rank0/plugins/profile/<time>/<host>.xplane.pb
    assert found[0].relative_to(outcome.job_dir / "profile").parts[:3] == ("rank0", "plugins", "profile")
    assert traced_steps(found[0]) == [2, 3]
    assert "ddlkit: profile of steps 2-3 written to profile/" in outcome.stdout
