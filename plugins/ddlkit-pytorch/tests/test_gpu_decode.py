"""data.decoder=gpu's pipeline on the CPU: everything but nvJPEG itself (tests/gpu/test_cuda.py runs
that on a GPU). The device decoder here is a real JPEG decoder (simplejpeg or Pillow, full size,
in the rank), so what is tested is the split between workers and rank: the crops drawn from the
headers, the files the workers decode on the CPU, the rank's crop/resize/flip/normalize, the
retries where the device decoder fails, on_corrupt, and the thread that decodes ahead."""

from __future__ import annotations

import gc
import io
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import torch
from PIL import Image

from ddlkit.errors import ConfigError, RunError
from ddlkit.images import MEAN, STD, Augment, CorruptImageError, resolve_decoder
from ddlkit.interfaces import Shard
from ddlkit.testing.images import make_image_dataset
from ddlkit_pytorch.gpu_decode import gpu_decoder, prefetched
from ddlkit_pytorch.imagefolder import TorchImageLoader

SIZE = 32


def full_size_decode(files: list[torch.Tensor]) -> list[torch.Tensor]:
    """What nvJPEG returns, decoded on the CPU: full-size RGB, uint8 CHW (raises RuntimeError for
    a file it cannot decode, as torchvision does)."""
    out = []
    for f in files:
        try:
            image = Image.open(io.BytesIO(f.numpy().tobytes()))
            image.load()
        except Exception as err:
            raise RuntimeError(f"cannot decode: {err}") from None
        out.append(torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1))
    return out


def files_of(root: Path, split: str = "train") -> tuple[list[str], list[int]]:
    classes = sorted(p.name for p in (root / split).iterdir())
    files = sorted(str(p) for p in (root / split).rglob("*") if p.is_file())
    return files, [classes.index(Path(f).parent.name) for f in files]


def loader(
    files: list[str],
    labels: list[int],
    *,
    train: bool = True,
    workers: int = 0,
    on_corrupt: str = "error",
    decode_jpegs=None,
    channels_last: bool = False,
    batch_size: int = 4,
) -> TorchImageLoader:
    aug = Augment(
        SIZE,
        train,
        val_resize=round(SIZE / 0.875),
        decoder=resolve_decoder("auto"),
        device_decoding=decode_jpegs is not None,
    )
    return TorchImageLoader(
        files,
        labels,
        aug,
        batch_size=batch_size,
        shard=Shard(),
        seed=7,
        workers=workers,
        on_corrupt=on_corrupt,
        device="cpu",
        channels_last=channels_last,
        decode_jpegs=decode_jpegs,
    )


def pixels(images: torch.Tensor) -> torch.Tensor:
    """Normalized images back to 0..255."""
    return images * torch.tensor(STD).view(1, 3, 1, 1) * 255 + torch.tensor(MEAN).view(1, 3, 1, 1) * 255


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    return make_image_dataset(
        tmp_path_factory.mktemp("images"),
        classes=3,
        train_per_class=6,
        val_per_class=2,
        sizes=((160, 120), (96, 144), (200, 150)),
        odd_files=True,
    )


@pytest.mark.parametrize("train,workers", [(True, 0), (False, 0), (True, 2)])
def test_device_decoding_serves_the_cpu_pipelines_batches(dataset, train: bool, workers: int) -> None:
    files, labels = files_of(dataset.root, "train" if train else "validation")
    cpu = loader(files, labels, train=train)
    gpu = loader(files, labels, train=train, workers=workers, decode_jpegs=full_size_decode)
    assert gpu.decoder == "gpu" and cpu.decoder in ("simplejpeg", "pil")
    n = 0
    for epoch in (0, 1):
        for (a, la), (b, lb) in zip(cpu.iter_epoch(epoch), gpu.iter_epoch(epoch), strict=True):
            assert torch.equal(la, lb)
            assert b.shape == a.shape == (len(la), 3, SIZE, SIZE) and b.dtype == torch.float32
            pa, pb = pixels(a), pixels(b)
            # the same crop, resized by the same filter from a full-size (not DCT-scaled) decode
            assert (pa - pb).abs().mean() < 4, (pa - pb).abs().mean()
            # ... and not merely similar images: the mirror image is much further off
            assert (pa.flip(3) - pb).abs().mean() > 3 * (pa - pb).abs().mean()
            n += len(la)
    assert n == 2 * (len(files) if not train else len(cpu) * 4)
    counts = gpu.decoded_counts
    assert counts["gpu_decoded_images"] + counts["cpu_decoded_images"] == n
    # the grayscale, CMYK and PNG files of the training split go to the CPU, each epoch
    assert counts["cpu_decoded_images"] == (2 * 3 if train else 0)
    del gpu  # its worker processes stop now, not when the test process ends
    gc.collect()


def test_a_resumed_epoch_starts_at_the_same_batch(dataset) -> None:
    files, labels = files_of(dataset.root)
    gpu = loader(files, labels, decode_jpegs=full_size_decode)
    whole = list(gpu.iter_epoch(1))
    resumed = list(gpu.iter_epoch(1, start_batch=2))
    assert len(resumed) == len(whole) - 2
    for (a, la), (b, lb) in zip(whole[2:], resumed, strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_channels_last_memory_format(dataset) -> None:
    files, labels = files_of(dataset.root)
    images, _ = next(iter(loader(files, labels, decode_jpegs=full_size_decode, channels_last=True).iter_epoch(0)))
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_a_file_the_device_decoder_refuses_is_decoded_on_the_cpu(dataset) -> None:
    files, labels = files_of(dataset.root)
    refused = []

    def refuses_the_first(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        if any(f[:3].tolist() == [0xFF, 0xD8, 0xFF] and f.numel() == batch[0].numel() for f in batch) and not refused:
            refused.append(len(batch))
            raise RuntimeError("nvjpeg: unsupported")
        return full_size_decode(batch)

    cpu = loader(files, labels)
    gpu = loader(files, labels, decode_jpegs=refuses_the_first)
    for (a, la), (b, lb) in zip(cpu.iter_epoch(0), gpu.iter_epoch(0), strict=True):
        assert torch.equal(la, lb)
        assert (pixels(a) - pixels(b)).abs().mean() < 4
    assert refused  # the batch call failed once: its files were decoded one by one, the refused one on the CPU


def corrupt_body(tmp_path: Path, dataset) -> tuple[list[str], list[int], str]:
    """The training split with one file whose header parses and whose data is garbage."""
    files, labels = files_of(dataset.root)
    good = next(f for f in files if f.endswith(".JPEG") and Image.open(f).mode == "RGB")
    data = Path(good).read_bytes()
    bad = tmp_path / "bad.JPEG"
    sos = data.index(b"\xff\xda")
    bad.write_bytes(data[: sos + 14] + b"\x00" * 40)  # the header and a scan that ends at once
    return [str(bad), *files], [labels[0], *labels], str(bad)


def test_a_file_cut_short_is_decoded_on_the_cpu_and_an_error_naming_it(tmp_path: Path, dataset) -> None:
    """nvJPEG decodes a file cut short without a word: the workers give such files (no
    end-of-image marker) to the CPU decoder, which says what is wrong with them."""
    files, labels, bad = corrupt_body(tmp_path, dataset)
    seen: list[int] = []

    def recording(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        seen.extend(f.numel() for f in batch)
        return full_size_decode(batch)

    gpu = loader(files, labels, train=False, decode_jpegs=recording)
    with pytest.raises(CorruptImageError, match="bad.JPEG"):
        list(gpu.iter_epoch(0))
    assert Path(bad).stat().st_size not in seen


def test_a_corrupt_body_is_skipped_with_on_corrupt_skip(tmp_path: Path, dataset, capfd: pytest.CaptureFixture) -> None:
    files, labels, bad = corrupt_body(tmp_path, dataset)
    gpu = loader(files, labels, train=False, on_corrupt="skip", decode_jpegs=full_size_decode)
    batches = list(gpu.iter_epoch(0))
    assert sum(len(lb) for _, lb in batches) == len(files)  # every image of the split, the bad one replaced
    assert gpu.skipped == 1
    assert "skipped corrupt image" in capfd.readouterr().err


def test_decoder_gpu_needs_a_cuda_device() -> None:
    assert resolve_decoder("gpu") in ("simplejpeg", "pil")  # the CPU decoder of the files the GPU does not take
    with pytest.raises(ConfigError, match="data.decoder=gpu needs a CUDA GPU, and this rank trains on cpu"):
        gpu_decoder(torch.device("cpu"))


def test_prefetched_hands_over_errors_and_stops_its_thread_when_closed() -> None:
    def batches():
        for i in range(100):
            yield (torch.full((2,), i),)

    it = prefetched(batches, torch.device("cpu"))
    assert next(it)[0].tolist() == [0, 0] and next(it)[0].tolist() == [1, 1]
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "ddlkit-gpu-decode"]

    def failing():
        yield (torch.zeros(1),)
        raise RunError("the workers died", component="data")

    with pytest.raises(RunError, match="the workers died"):
        list(prefetched(failing, torch.device("cpu")))


def test_decoder_gpu_with_a_cpu_device_is_refused_before_anything_runs(tmp_path: Path, dataset) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=pytorch",
            "framework.device=cpu",
            "data=imagefolder",
            f"data.root={dataset.root}",
            "data.decoder=gpu",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ddlkit: error: data.decoder=gpu decodes on a CUDA GPU, and framework.device=cpu was chosen: use "
        "framework.device=cuda (or auto) on a machine with one, or data.decoder=auto."
    ]
    assert not (tmp_path / "job" / "job.json").exists()


@pytest.mark.parametrize("on_corrupt", ["error", "skip"])
def test_a_file_neither_decoder_reads_follows_on_corrupt(tmp_path: Path, dataset, on_corrupt: str) -> None:
    """The device decoder refuses a file, and the CPU's second try cannot read it either (here:
    gone from the disk by then): data.on_corrupt decides, as for any corrupt file."""
    files, labels = files_of(dataset.root, "validation")
    victim = tmp_path / "victim.JPEG"
    victim.write_bytes(Path(files[0]).read_bytes() + b"\x00" * 8)  # a size of its own
    files, labels = [str(victim), *files], [labels[0], *labels]

    size = victim.stat().st_size

    def refuses_the_victim(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        if any(f.numel() == size for f in batch):
            victim.unlink(missing_ok=True)
            raise RuntimeError("nvjpeg: bad data")
        return full_size_decode(batch)

    gpu = loader(files, labels, train=False, on_corrupt=on_corrupt, decode_jpegs=refuses_the_victim)
    if on_corrupt == "error":
        with pytest.raises(CorruptImageError, match="victim.JPEG"):
            list(gpu.iter_epoch(0))
        return
    batches = list(gpu.iter_epoch(0))
    assert sum(len(lb) for _, lb in batches) == len(files) and gpu.skipped == 1
    assert gpu.decoded_counts["cpu_decoded_images"] == 1  # the substitute, decoded on the CPU in the rank
