"""dist=fsdp on the CPU gives freed blocks back to the system (framework.fsdp_mmap_threshold_mib):
glibc's malloc, left as it is, keeps blocks of up to 32 MiB in its heap once one that large was
freed, and sharded training frees such blocks all along (the model built whole, then sharded; the
blocks gathered each step; a checkpoint's copies)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from ddlkit.testing import RunFactory

# a 16 MiB block freed (glibc then raises its threshold to 16 MiB), then 50 blocks of 8 MiB
# written and all but the last freed: what the process still holds of them, in MiB
_HELD_AFTER_FREES = textwrap.dedent(
    """
    import ctypes, sys
    from pathlib import Path
    from ddlkit_pytorch.sharded import return_large_frees

    print(return_large_frees(int(sys.argv[1])) if sys.argv[1] != "-" else None)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    MiB = 2**20

    def rss():
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024

    big = libc.malloc(16 * MiB)
    ctypes.memset(big, 1, 16 * MiB)
    libc.free(big)
    before = rss()
    blocks = [libc.malloc(8 * MiB) for _ in range(50)]
    for b in blocks:
        ctypes.memset(b, 1, 8 * MiB)
    for b in blocks[:-1]:
        libc.free(b)
    print(rss() - before)
    """
)


def _held(threshold: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _HELD_AFTER_FREES, threshold],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_go_back_to_the_system_with_the_threshold_and_stay_without() -> None:
    assert _held("-")[1] >= 300  # glibc as it is: 49 freed blocks of 8 MiB stay in the process
    assert _held("1") == ("True", pytest.approx(8, abs=40))  # only the block still in use
    # a threshold the user set in the environment stands: nothing changed, the blocks stay
    said, held = _held("1", MALLOC_MMAP_THRESHOLD_="33554432")
    assert (said, held >= 300) == ("False", True)


def test_the_threshold_is_checked(run_factory: RunFactory) -> None:
    run_factory("framework=pytorch", "framework.fsdp_mmap_threshold_mib=64").assert_one_line_error(
        "framework.fsdp_mmap_threshold_mib=64 is invalid: it must be between 0 and 32 (MiB)"
    )
