"""A plugin for the hung-rank tests: one rank that is slow but alive.

With ``DDLKIT_TEST_BUSY_RANK=R:STEP:SECONDS``, rank R spends SECONDS computing in pure Python at
logged step STEP while the other ranks wait for it: the main thread holds the GIL as much as a
Python loop can, yet the rank's heartbeats must go on, and nobody may call it hung.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import ddlkit


@ddlkit.hookimpl
def ddlkit_step_end(run: Any, step: int, metrics: Mapping[str, float]) -> None:
    rank, at_step, seconds = os.environ["DDLKIT_TEST_BUSY_RANK"].split(":")
    if run.dist.rank != int(rank) or step != int(at_step):
        return
    print(f"busy_rank: rank {rank} computes for {seconds} s at step {step}", flush=True)
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        sum(range(1000))
