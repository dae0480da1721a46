"""ddlkit.cpu: whether the CPU computes bf16 in hardware, from its flags (x86 and Arm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit import cpu


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n", True),
        ("processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_bf16\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),  # Arm
        ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n", False),
        ("processor\t: 0\n", None),  # no flags listed: unknown, no warning
    ],
)
def test_has_bf16_reads_the_cpus_flags(
    text: str, expected: bool | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cpuinfo").write_text(text)
    monkeypatch.setattr(cpu, "CPUINFO", tmp_path / "cpuinfo")
    assert cpu.has_bf16() is expected
    assert (cpu.bf16_warning("bf16") is not None) is (expected is False)
    assert cpu.bf16_warning("fp32") is None


def test_unreadable_flags_warn_of_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "CPUINFO", tmp_path / "absent")
    assert cpu.has_bf16() is None and cpu.bf16_warning("bf16") is None
