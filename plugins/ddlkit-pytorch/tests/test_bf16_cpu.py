"""trainer.precision=bf16 on a CPU that emulates bf16 trains about 10x slower than fp32: rank 0
says so once, before training (issue 22, item 9). The CPU's flags come from a cpuinfo file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ddlkit_pytorch.plugin
from ddlkit import cpu
from ddlkit.testing import add_plugin

TINY = (
    "framework=pytorch",
    "model=resnet18",
    "data.image_size=16",
    "data.length=8",
    "data.val_length=4",
    "data.num_classes=4",
    "trainer.batch_size=4",
    "trainer.epochs=1",
    "framework.device=cpu",
)
WARNING = "ddlkit: warning: trainer.precision=bf16 on a CPU without bf16 instructions"


@pytest.mark.parametrize(
    ("flags", "precision", "warned"),
    [
        ("fpu sse2 avx2 avx512f", "bf16", True),
        ("fpu sse2 avx2 avx512f avx512_bf16", "bf16", False),
        ("fpu sse2 avx2 avx512f", "fp32", False),
    ],
)
def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_of_once(
    flags: str,
    precision: str,
    warned: bool,
    run_inprocess: Any,
    ddlkit_pm: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("".join(f"processor\t: {n}\nflags\t\t: {flags}\n\n" for n in range(2)))
    monkeypatch.setattr(cpu, "CPUINFO", cpuinfo)
    add_plugin(ddlkit_pm, ddlkit_pytorch.plugin, name="pytorch")
    assert run_inprocess(*TINY, f"trainer.precision={precision}").exit_code == 0
    assert capsys.readouterr().err.count(WARNING) == int(warned)
