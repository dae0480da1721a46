"""`pip install -r requirements.txt && ddlkit` brings no Pillow (issue 22, item 1): runs that
read no image files must train without it, and data=imagefolder must say what to install.

Pillow is hidden from the launcher and from its ranks by a ``sitecustomize`` on ``PYTHONPATH``
that marks ``PIL`` as absent (``sys.modules['PIL'] = None``: ``import PIL`` then fails as it would
in a fresh virtual environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.testing.images import make_image_dataset

pytest.importorskip("torch")

TINY = [
    "framework=pytorch",
    "model=resnet18",
    "data.image_size=16",
    "data.num_classes=4",
    "data.length=32",
    "data.val_length=8",
    "trainer.batch_size=8",
    "trainer.epochs=1",
    "framework.num_threads=1",
]


def ddlkit_without_pillow(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    hide = tmp_path / "no-pillow"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['PIL'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_synthetic_data_trains_without_pillow(tmp_path: Path) -> None:
    proc = ddlkit_without_pillow(tmp_path, *TINY, f"hydra.run.dir={tmp_path / 'job'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "job" / "result.json").read_text())["steps"] == 4


def test_imagefolder_without_pillow_says_what_to_install_before_anything_runs(tmp_path: Path) -> None:
    root = make_image_dataset(tmp_path / "images", classes=2, train_per_class=2, val_per_class=1).root
    proc = ddlkit_without_pillow(
        tmp_path, "framework=pytorch", "data=imagefolder", f"data.root={root}", f"hydra.run.dir={tmp_path / 'job'}"
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ddlkit: error: data=imagefolder decodes images with Pillow, which is not installed: pip install pillow "
        "(and simplejpeg for faster JPEG decoding: pip install simplejpeg)"
    ]
    assert not (tmp_path / "job" / "job.json").exists()
