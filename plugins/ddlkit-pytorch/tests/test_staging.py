"""The host copy a checkpoint in the background writes (ddlkit_pytorch.staging)."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("torch")

import torch

from ddlkit_pytorch.models import resnet18
from ddlkit_pytorch.staging import HostStaging


def _saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_the_copy_is_the_state_of_its_step_and_its_buffers_are_reused() -> None:
    model = resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(2, 3, 32, 32)).sum().backward()
        optimizer.step()

    def state() -> dict:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "meta": {"state": {"step": 1}},
        }

    step()
    staging = HostStaging()
    copy = staging.copy(state())
    before = _saved(state())
    assert _saved(copy) == before  # the same bytes, the modules' _metadata included
    step()  # the training goes on: the copy keeps step 1's values
    assert _saved(copy) == before != _saved(state())
    again = staging.copy(state())
    assert again["model"]["fc.weight"].data_ptr() == copy["model"]["fc.weight"].data_ptr()
    assert _saved(again) == _saved(state())
    model.load_state_dict(again["model"])  # a module's version metadata came along
