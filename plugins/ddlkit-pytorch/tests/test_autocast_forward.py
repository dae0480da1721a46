"""AutocastForward: what framework.compile compiles when a run autocasts (the dtype must be part of
the compiled graph; on a GPU with torch.compile: tests/gpu)."""

from __future__ import annotations

import torch
from torch import nn

from ddlkit_pytorch.models import AutocastForward


def test_runs_the_module_under_autocast_and_adds_no_state() -> None:
    torch.manual_seed(0)
    inner = nn.Linear(4, 3)
    wrapped = AutocastForward(inner, "cpu", torch.bfloat16)
    x = torch.randn(2, 4)
    out = wrapped(x)
    assert out.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(out, inner(x))
    assert inner(x).dtype == torch.float32  # nothing leaks out of the wrapper
    assert list(wrapped.parameters()) == list(inner.parameters())
    assert [k.removeprefix("module.") for k in wrapped.state_dict()] == list(inner.state_dict())
