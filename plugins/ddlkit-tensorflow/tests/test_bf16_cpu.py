"""trainer.precision=bf16 on a CPU that emulates bf16 trains about 10x slower than fp32: rank 0
says so once, before training (issue 22, item 9). The CPU's flags come from a cpuinfo file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ddlkit_tensorflow.plugin
from ddlkit import cpu
from ddlkit.testing import add_plugin


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_of_once(
    run_inprocess: Any,
    ddlkit_pm: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    monkeypatch.setattr(cpu, "CPUINFO", tmp_path / "cpuinfo")
    add_plugin(ddlkit_pm, ddlkit_tensorflow.plugin, name="tensorflow")
    out = run_inprocess(
        "framework=tensorflow",
        "model=resnet18",
        "data.image_size=16",
        "data.length=8",
        "data.val_length=4",
        "data.num_classes=4",
        "trainer.batch_size=4",
        "trainer.epochs=1",
        "trainer.precision=bf16",
        "framework.device=cpu",
    )
    assert out.exit_code == 0
    assert (
        capsys.readouterr().err.count("ddlkit: warning: trainer.precision=bf16 on a CPU without bf16 instructions") == 1
    )
