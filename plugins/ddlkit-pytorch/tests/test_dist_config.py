"""The PyTorch plugin's launcher-side checks of the dist settings (training with several ranks
is tested end to end in test_dist.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import ddlkit
from ddlkit.testing import horovod_at
from ddlkit_pytorch.framework import PytorchConfig, PytorchFramework


def config(backend: str) -> object:
    return OmegaConf.create(
        {"trainer": {"precision": "fp32"}, "dist": {"backend": backend}, "data": {"name": "synthetic"}}
    )


def test_horovod_not_installed_is_refused_with_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    horovod_at(monkeypatch, None)
    with pytest.raises(ddlkit.ConfigError) as info:
        PytorchFramework(PytorchConfig()).check_environment(config("horovod"))
    assert str(info.value) == (
        "dist=horovod with framework=pytorch needs Horovod, which is not installed. Build it "
        "against the installed torch with scripts/install_horovod.sh (Horovod 0.28.1 patched to "
        "C++17; about 6 minutes on 2 cores, 9 with TensorFlow installed too, then the wheel is "
        "cached), or use dist=native."
    )
    PytorchFramework(PytorchConfig()).check_environment(config("native"))  # native needs nothing extra


def test_horovod_without_its_torch_build_is_refused_with_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "mpi_lib.cpython-312-x86_64-linux-gnu.so").touch()  # another framework's binding
    horovod_at(monkeypatch, tmp_path)
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"^dist=horovod with framework=pytorch: the installed Horovod "
        r"was built without PyTorch support\. Build it against the "
        r"installed torch with scripts/install_horovod.sh",
    ):
        PytorchFramework(PytorchConfig()).check_environment(config("horovod"))


def test_a_horovod_built_for_torch_is_accepted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "mpi_lib_v2.cpython-312-x86_64-linux-gnu.so").touch()
    horovod_at(monkeypatch, tmp_path)
    PytorchFramework(PytorchConfig()).check_environment(config("horovod"))


def test_each_rank_of_a_node_gets_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    fw = PytorchFramework(PytorchConfig(device="cuda"))
    assert fw._device(ddlkit.DistContext(rank=3, world_size=4, local_rank=1, local_size=2)) == torch.device("cuda:1")
    assert fw._device(ddlkit.DistContext()) == torch.device("cuda")
    on_cpu = PytorchFramework(PytorchConfig(device="cpu"))
    assert on_cpu._device(SimpleNamespace(world_size=2, local_rank=1)).type == "cpu"


def test_a_rank_without_a_gpu_of_its_own_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    fw = PytorchFramework(PytorchConfig(device="cuda"))
    assert fw._device(ddlkit.DistContext(rank=0, world_size=2, local_rank=0, local_size=2)) == torch.device("cuda:0")
    with pytest.raises(ddlkit.ConfigError, match=r"sees 1 GPU\(s\) on this node, so rank 1 \(local rank 1\) has none"):
        fw._device(ddlkit.DistContext(rank=1, world_size=2, local_rank=1, local_size=2))


def test_a_negative_thread_count_is_refused() -> None:
    """Issue 17, item 14: framework.num_threads=-3 passed validation and crashed in torch."""
    with pytest.raises(ddlkit.ConfigError) as info:
        PytorchFramework(PytorchConfig(num_threads=-3)).configure(config("none"))
    assert str(info.value) == (
        "framework.num_threads=-3 is invalid: use auto (the cores this process may use, "
        "shared by the ranks of its node), a number of threads >= 1, or 0 (torch's default: "
        "all cores)."
    )
    for fine in (0, 3, "auto"):
        PytorchFramework(PytorchConfig(num_threads=fine)).configure(config("none"))


def test_fp16_on_the_cpu_is_refused_at_launch_with_what_to_use() -> None:
    fp16 = OmegaConf.create({"trainer": {"precision": "fp16"}, "dist": {"backend": "none"}, "data": {"name": "x"}})
    with pytest.raises(ddlkit.ConfigError) as info:
        PytorchFramework(PytorchConfig(device="cpu")).configure(fp16)
    assert str(info.value) == (
        "trainer.precision=fp16 needs a GPU (framework.device=cpu was chosen); on the CPU use "
        "trainer.precision=bf16 (or fp32) with framework=pytorch."
    )
    PytorchFramework(PytorchConfig(device="auto")).configure(fp16)  # the rank decides where it computes
