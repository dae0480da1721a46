"""The PyTorch plugin on a GPU: every precision, channels_last and framework.compile train on
CUDA through the real CLI; deterministic runs repeat bit for bit; the image-folder pipeline's
pinned, GPU-normalized batches equal the CPU-normalized ones, and data.decoder=gpu's (nvJPEG) equal
the CPU-decoded ones; NCCL initializes for dist=native.

Needs a CUDA GPU and ``DDLKIT_RUN_GPU_TESTS=1`` (skipped otherwise, so CPU CI skips them); in
plugins/ddlkit-pytorch:

    DDLKIT_RUN_GPU_TESTS=1 python -m pytest tests/gpu -v
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ddlkit_pytorch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DDLKIT_RUN_GPU_TESTS") != "1",
        reason="GPU tests: set DDLKIT_RUN_GPU_TESTS=1 on a machine with a CUDA GPU",
    ),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU"),
]

# small but real: ResNet-18 at 64 px, 6 steps, validation on (evaluate() under autocast too)
COMMON = [
    "framework=pytorch",
    "framework.device=cuda",
    "model=resnet18",
    "data.image_size=64",
    "trainer.batch_size=16",
    "trainer.epochs=1",
    "trainer.log_every=1",
    "trainer.warmup_steps=1",
]
SYNTHETIC = ["data.num_classes=10", "data.length=96", "data.val_length=32"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """As in the core's suite, where these tests lived: environment restored (and leaks
    reported), a working directory of its own, fresh plugin and Hydra state."""


def ddlkit(job_dir: Path, *overrides: str) -> dict:
    data = [] if "data=imagefolder" in overrides else SYNTHETIC
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit", *COMMON, *data, *overrides, f"hydra.run.dir={job_dir}"],
        cwd=job_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((job_dir / "result.json").read_text())


@pytest.mark.parametrize(
    "precision,channels_last,compile",
    [
        ("fp32", False, False),
        ("bf16", False, False),
        ("fp16", False, False),
        ("fp16", True, False),
        ("bf16", True, True),
        ("fp16", True, True),
    ],
)
def test_trains_on_cuda(tmp_path: Path, precision: str, channels_last: bool, compile: bool) -> None:
    result = ddlkit(
        tmp_path / "job",
        f"trainer.precision={precision}",
        f"framework.channels_last={channels_last}",
        f"framework.compile={compile}",
    )
    assert result["device"].startswith("cuda")
    assert result["device_name"] == torch.cuda.get_device_name()
    assert result["precision"] == precision
    assert math.isfinite(result["final_loss"]) and math.isfinite(result["val_loss"])
    assert result["steps"] == 6 and result["images_per_sec"] > 0
    if precision == "fp16":  # the gradient scaler ran (and did not collapse to 0)
        assert result["loss_scale"] > 0
    else:
        assert "loss_scale" not in result


def test_deterministic_runs_repeat_bit_for_bit_on_cuda(tmp_path: Path) -> None:
    more = ["trainer.deterministic=true", "trainer.precision=bf16", "framework.channels_last=true"]
    first = ddlkit(tmp_path / "a", *more)
    second = ddlkit(tmp_path / "b", *more)
    assert first["final_loss"] == second["final_loss"]
    assert (tmp_path / "a" / "model.pt").read_bytes() == (tmp_path / "b" / "model.pt").read_bytes()


def test_compile_keeps_each_runs_autocast_dtype(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch 2.11 reuses a graph compiled under ambient bf16 autocast for a later fp16 one (after
    torch._dynamo.reset(), and from the on-disk cache in a new process); the plugin compiles
    AutocastForward, whose graph holds the dtype."""
    from ddlkit_pytorch.models import AutocastForward

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # Triton writes these into the environment at its first compile: restored after the test
    # (delenv of an unset variable records nothing to restore, hence the setenv first)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TRITON_PTXAS_PATH", "")
    monkeypatch.delenv("TRITON_PTXAS_PATH")

    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 14 * 14, 10),
        ).cuda()

    x = torch.randn(4, 3, 16, 16, device="cuda")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.compile(net())(x).dtype == torch.bfloat16
        torch._dynamo.reset()
        for dtype in (torch.float16, torch.bfloat16, torch.float16):
            with torch.autocast("cuda", dtype=dtype):  # ambient too, as the plugin's step has it
                assert torch.compile(AutocastForward(net(), "cuda", dtype))(x).dtype == dtype
            torch._dynamo.reset()
    finally:
        torch._dynamo.reset()


def test_deterministic_in_process_sets_cublas_config_for_the_run_only() -> None:
    from ddlkit_pytorch.framework import CUBLAS_DETERMINISTIC, _cuda_settings

    before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    with _cuda_settings(torch.device("cuda"), deterministic=True):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == (before or CUBLAS_DETERMINISTIC)
        assert torch.backends.cudnn.benchmark is False
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == before
    with _cuda_settings(torch.device("cuda"), deterministic=False):
        assert torch.backends.cudnn.benchmark is True


@pytest.mark.parametrize("channels_last", [False, True])
def test_imagefolder_batches_are_pinned_and_normalized_on_the_gpu_like_on_the_cpu(
    tmp_path: Path, channels_last: bool
) -> None:
    from ddlkit import Shard
    from ddlkit.testing.core import ImageFolderConfig, ImageFolderData
    from ddlkit.testing.images import make_image_dataset

    ds = make_image_dataset(tmp_path / "imagenet", classes=3, train_per_class=4, val_per_class=1)
    source = ImageFolderData(ImageFolderConfig(root=str(ds.root), image_size=32, workers=2))
    from ddlkit_pytorch.data import torch_loader

    def batches(device: str) -> list:
        neutral = source.loader("train", batch_size=4, shard=Shard(), seed=0)
        return list(
            torch_loader(neutral, images=True, device=torch.device(device), channels_last=channels_last).iter_epoch(0)
        )

    gpu, cpu = batches("cuda"), batches("cpu")
    assert len(gpu) == len(cpu) == 3
    for (gi, gl), (ci, cl) in zip(gpu, cpu, strict=True):
        assert gi.is_cuda and gl.is_cuda and gi.dtype == torch.float32
        assert gi.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert torch.equal(gl.cpu(), cl)
        torch.testing.assert_close(gi.cpu(), ci, atol=1e-5, rtol=1e-5)


def batches(root: Path, train: bool, decoder: str, device: str, **config: object) -> tuple[list, object]:
    """One epoch's batches, and their loader (for its counts)."""
    from ddlkit import Shard
    from ddlkit.testing.core import ImageFolderConfig, ImageFolderData
    from ddlkit_pytorch.data import torch_loader

    source = ImageFolderData(ImageFolderConfig(root=str(root), image_size=64, workers=2, decoder=decoder, **config))
    loader = torch_loader(
        source.loader("train" if train else "val", batch_size=4, shard=Shard(), seed=0),
        images=True,
        device=torch.device(device),
        channels_last=True,
    )
    return list(loader.iter_epoch(0)), loader


@pytest.fixture
def _inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torchvision's first import writes torch's compile-cache location into the environment (seen
    on torch 2.11): kept per test, as the other tests here do."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.mark.usefixtures("_inductor_cache")
@pytest.mark.parametrize("train", [True, False])
def test_nvjpeg_batches_equal_the_cpu_paths(tmp_path: Path, train: bool) -> None:
    """data.decoder=gpu: the same images, crops and flips as the CPU path, within what decoding at
    full size (nvJPEG) instead of DCT-scaled (libjpeg-turbo) changes; grayscale, CMYK and PNG
    files go to the CPU."""
    from ddlkit.images import MEAN, STD
    from ddlkit.testing.images import make_image_dataset

    ds = make_image_dataset(
        tmp_path / "imagenet",
        classes=3,
        train_per_class=8,
        val_per_class=4,
        odd_files=True,
        sizes=((500, 375), (333, 500), (640, 480)),
    )
    (gpu, loader), (cpu, _) = batches(ds.root, train, "gpu", "cuda"), batches(ds.root, train, "pil", "cpu")
    assert loader.decoder == "gpu" and len(gpu) == len(cpu) > 0
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1) * 255, torch.tensor(STD).view(1, 3, 1, 1) * 255
    for (gi, gl), (ci, cl) in zip(gpu, cpu, strict=True):
        assert gi.is_cuda and gi.dtype == torch.float32 and gi.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(gl.cpu(), cl)
        g, c = gi.cpu() * std + mean, ci * std + mean
        diff, mirrored = (g - c).abs().mean().item(), (g.flip(3) - c).abs().mean().item()
        assert diff < 6 and mirrored > 1.5 * diff, (diff, mirrored)
    counts = loader.decoded_counts
    assert counts["cpu_decoded_images"] == (3 if train else 0), counts  # the grayscale, CMYK and PNG files
    assert counts["gpu_decoded_images"] == sum(len(lbl) for _, lbl in gpu) - counts["cpu_decoded_images"]


@pytest.mark.usefixtures("_inductor_cache")
@pytest.mark.parametrize("on_corrupt", ["error", "skip"])
def test_a_jpeg_cut_short_goes_to_the_cpu_and_on_corrupt(tmp_path: Path, on_corrupt: str) -> None:
    """nvJPEG decodes a file cut short without a word (seen on an H200): the workers give such
    files to the CPU, and data.on_corrupt decides."""
    from ddlkit.images import CorruptImageError
    from ddlkit.testing.images import make_image_dataset

    ds = make_image_dataset(tmp_path / "imagenet", classes=2, train_per_class=4, val_per_class=2, sizes=((320, 240),))
    good = sorted((ds.root / "validation" / ds.classes[0]).iterdir())[0]
    data = good.read_bytes()
    sos = data.index(b"\xff\xda")
    (good.parent / "bad.JPEG").write_bytes(data[: sos + 14] + b"\x00" * 40)  # the header, then no image data
    if on_corrupt == "error":
        with pytest.raises(CorruptImageError, match="bad.JPEG"):
            batches(ds.root, False, "gpu", "cuda", on_corrupt=on_corrupt)
        return
    gpu, loader = batches(ds.root, False, "gpu", "cuda", on_corrupt=on_corrupt)
    # validation keeps every image: the bad one's place taken by the next
    assert loader.skipped == 1 and sum(len(lbl) for _, lbl in gpu) == 5


def test_imagefolder_trains_on_cuda_with_worker_processes(tmp_path: Path) -> None:
    from ddlkit.testing.images import make_image_dataset

    ds = make_image_dataset(tmp_path / "imagenet", classes=3, train_per_class=8, val_per_class=2, odd_files=True)
    common = [
        "data=imagefolder",
        f"data.root={ds.root}",
        "data.image_size=64",
        "data.workers=2",
        "trainer.batch_size=4",
        "trainer.precision=bf16",
        "framework.channels_last=true",
    ]
    for decoder in ("auto", "gpu"):
        result = ddlkit(tmp_path / decoder, *common, f"data.decoder={decoder}")
        assert result["device"].startswith("cuda") and result["steps"] == 6
        assert math.isfinite(result["final_loss"])
        if decoder == "auto":  # auto decodes on the CPU, where it was faster (benchmarks/gpu.py)
            assert result["decoder"] in ("simplejpeg", "pil") and "gpu_decoded_images" not in result
    # data.decoder=gpu: nvJPEG, and the grayscale, CMYK and PNG files on the CPU
    assert result["decoder"] == "gpu" and result["cpu_decoded_images"] == 3, result
    assert result["gpu_decoded_images"] == 24 - 3


def test_nccl_process_group_and_ddp_train_one_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dist=native's NCCL path (a job of one rank never takes it, so it is driven directly)."""
    import torch.distributed as tdist

    from ddlkit_pytorch.framework import Replicas, init_process_group
    from ddlkit_pytorch.models import build_model

    # DDP's first use writes torch's compile-cache location into the environment: keep it per test
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29517")
    device = torch.device("cuda", 0)
    init_process_group(torch.device("cuda"), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        assert tdist.get_backend() == "nccl"
        x = torch.ones(4, device=device)
        tdist.all_reduce(x)
        assert x.tolist() == [1.0] * 4
        replicas = Replicas(
            SimpleNamespace(
                cfg=SimpleNamespace(dist=SimpleNamespace(backend="native")), dist=SimpleNamespace(world_size=1)
            ),
            device,
        )
        replicas.backend = "native"  # as a rank of a multi-rank job would have it (the group exists already)
        model = build_model("resnet18", num_classes=10).to(device, memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        ddp = replicas.wrap_model(model, opt)
        assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
        scaler = torch.amp.GradScaler("cuda")
        images = torch.randn(8, 3, 64, 64, device=device).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 10, (8,), device=device)
        losses = []
        for _ in range(4):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(ddp(images), labels)
            opt.zero_grad()
            scaler.scale(loss).backward()
            replicas.step(opt, scaler)
            scaler.update()
            losses.append(loss.item())
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    finally:
        tdist.destroy_process_group()
