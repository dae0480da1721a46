"""What this machine's CPU computes in hardware, for the ranks that compute on it, and the
precisions a CPU cannot train in.

A CPU without bf16 instructions (x86: ``avx512_bf16`` or ``amx_bf16``; Arm: ``bf16``) emulates
every bf16 operation: ``trainer.precision=bf16`` then trains about 10x slower than fp32 (issue 22,
item 9). A rank that computes on such a CPU says so once, on rank 0, before training.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

#: where Linux lists the CPU's instruction-set flags
CPUINFO = Path("/proc/cpuinfo")
#: the flags of bf16 arithmetic in hardware (x86's AVX-512 and AMX extensions; Arm's Features)
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def has_bf16() -> bool | None:
    """Whether the CPU computes bf16 in hardware; None where its flags cannot be read."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags = {
        flag
        for line in text.splitlines()
        if line.partition(":")[0].strip() in ("flags", "Features")
        for flag in line.partition(":")[2].split()
    }
    return bool(flags & BF16_FLAGS) if flags else None


def bf16_warning(precision: str) -> str | None:
    """The warning for ``trainer.precision=precision`` computed on this CPU, if it is due."""
    if precision != "bf16" or has_bf16() is not False:
        return None
    return (
        "trainer.precision=bf16 on a CPU without bf16 instructions (no avx512_bf16, amx_bf16 or bf16 in "
        f"{CPUINFO}): every bf16 operation is emulated, about 10x slower than fp32; use trainer.precision=fp32 "
        "on this machine"
    )


def fp16_refusal(framework: str, why: str) -> ConfigError:
    """``trainer.precision=fp16`` where there is no GPU: fp16 needs one (a CPU has no fp16 units
    to train with, and loss scaling is the GPUs'). ``why`` says how it came to a CPU -- the
    config chose it (the launcher's check) or the rank found no GPU (the rank's)."""
    return ConfigError(
        f"trainer.precision=fp16 needs a GPU ({why}); on the CPU use trainer.precision=bf16 "
        f"(or fp32) with framework={framework}."
    )
