"""The PyTorch plugin's process-wide CUDA settings (cuDNN autotuning, cuBLAS determinism), set for
a run and restored after it; the training itself on a GPU is tested in tests/gpu."""

from __future__ import annotations

import os

import pytest

from ddlkit_pytorch import framework


def test_cuda_settings_are_the_runs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic GPU runs get cuBLAS's deterministic workspace and no cuDNN autotuning; the
    others autotune; the process's settings come back afterwards (checked without a GPU: only
    flags and the environment change)."""
    import torch

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    with framework._cuda_settings(torch.device("cuda"), deterministic=True):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == framework.CUBLAS_DETERMINISTIC
        assert torch.backends.cudnn.benchmark is False
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with framework._cuda_settings(torch.device("cuda"), deterministic=False):
        assert torch.backends.cudnn.benchmark is True
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert torch.backends.cudnn.benchmark is False
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stays
    with framework._cuda_settings(torch.device("cuda"), deterministic=True):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    with framework._cuda_settings(torch.device("cpu"), deterministic=True):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and torch.backends.cudnn.benchmark is False
