"""A TensorFlow run's one clear error line stands alone (issue 23, minor): a corrupt image was
reported inside ~20 lines of TensorFlow's C++ log (absl's and oneDNN's load notices, libjpeg's
complaint, a rendezvous aborting)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.testing.images import make_image_dataset

pytest.importorskip("tensorflow")
pytest.importorskip("ddlkit_tensorflow")

pytestmark = pytest.mark.slow


def test_a_corrupt_image_is_one_line_without_tensorflow_log_noise(tmp_path: Path) -> None:
    data = make_image_dataset(tmp_path / "root", classes=3, train_per_class=6, val_per_class=2, corrupt=True)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=tensorflow",
            "model=resnet18",
            "data=imagefolder",
            f"data.root={data.root}",
            "data.image_size=32",
            "trainer.batch_size=4",
            "trainer.epochs=1",
            "framework.num_threads=1",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "DDLKIT_STATE_DIR": str(tmp_path / "state")},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert "CorruptImageError: cannot decode image" in out
    noise = re.findall(r"^\s*(?:[IWE]\d{4} .*|WARNING: All log messages.*|\s*\[\[\{\{function_node.*)$", out, re.M)
    assert noise == [], out[-4000:]
