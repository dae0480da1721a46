"""ddlkit's image-folder input pipeline against the one a user would write, in one process.

Data: an ImageNet-like folder made here (photo-like JPEGs of ImageNet's typical sizes, quality 90).
Baseline: an ``ImageFolder``-style ``Dataset`` (Pillow open -> convert RGB -> RandomResizedCrop ->
flip -> ToTensor -> Normalize, torchvision's semantics written out, since torchvision's wheels do
not load against the CPU torch here) in a ``DataLoader`` with the same worker count and batch size.

1. Pipeline throughput (images/s, no model) of the baseline and of ddlkit's PyTorch and
   TensorFlow pipelines over the same files. Goal: ddlkit >= 1.0x the baseline.
2. Data wait inside a real training loop: ResNet-18 at 224 px on this CPU, fed by each pipeline;
   the wait is the time blocked in ``next(batch)``. Goal: < 5 % of the step time with ddlkit.

With ``--before REF`` the same benchmark also runs as it was at git REF, on that revision's code
(exported, first on ``PYTHONPATH``; ``_common.run_before``), after this one; the JSON gains
``before``: its figures, and each pipeline's ddlkit/baseline ratio now over the ratio then (the
baseline, unchanged, absorbs the drift between the two runs).

    python benchmarks/input_pipeline.py [--images 480 --workers 2 --batch 32 --rounds 3 --train-steps 4]
        [--before REF]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import run_before, save_photo_like, summary, write_result

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_dataset(root: Path, images: int, classes: int) -> None:
    """Photo-like JPEGs (see ``_common.save_photo_like``) in ``classes`` class folders."""
    for i in range(images):
        save_photo_like(root / "train" / f"n{i % classes:08d}" / f"{i:06d}.JPEG", i)


# ---------------------------------------------------------------------------- the baseline
class BaselineImageFolder:
    """What a user writes: torchvision.datasets.ImageFolder + transforms, spelled out."""

    def __init__(self, root: Path, size: int) -> None:
        classes = sorted(d.name for d in (root / "train").iterdir())
        self.samples = [(str(p), i) for i, c in enumerate(classes) for p in sorted((root / "train" / c).iterdir())]
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        import torch
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        w, h = img.size
        for _ in range(10):  # RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3))
            area = w * h * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            x, y, cw, ch = 0, 0, w, h
        img = img.crop((x, y, x + cw, y + ch)).resize((self.size, self.size), Image.Resampling.BILINEAR)
        if random.random() < 0.5:  # RandomHorizontalFlip
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)  # ToTensor
        return (t - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1), label  # Normalize


def baseline_loader(root: Path, size: int, batch: int, workers: int) -> Any:
    import torch

    return torch.utils.data.DataLoader(
        BaselineImageFolder(root, size),
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        persistent_workers=workers > 0,
    )


def ddlkit_loader(root: Path, framework: str, size: int, batch: int, workers: int) -> Any:
    """The data source's loader through the framework plugin's adapter, as a run gets it."""
    from ddlkit import Shard
    from ddlkit.builtin.imagefolder import ImageFolderConfig, ImageFolderData

    source = ImageFolderData(ImageFolderConfig(root=str(root), image_size=size, workers=workers))
    neutral = source.loader("train", batch_size=batch, shard=Shard(), seed=0)
    if framework == "pytorch":
        from ddlkit_pytorch.data import torch_loader

        return torch_loader(neutral, images=True, device="cpu", channels_last=False)
    from ddlkit_tensorflow.data import tf_loader

    return tf_loader(neutral)


# ---------------------------------------------------------------------------- measurements
def epochs_of(loader: Any, is_ddlkit: bool) -> Iterator[Any]:
    epoch = 0
    while True:
        yield from (loader.iter_epoch(epoch) if is_ddlkit else loader)
        epoch += 1


def pipeline_rate(batches: Iterator[Any], batch: int, n: int, skip: int) -> float:
    """images/s over ``n`` batches, after ``skip`` batches that were ready before the round began."""
    for _ in range(skip):
        next(batches)
    t0 = time.perf_counter()
    for _ in range(n):
        next(batches)
    return n * batch / (time.perf_counter() - t0)


def train_with(batches: Iterator[Any], steps: int, warmup: int, classes: int) -> dict[str, float]:
    """ResNet-18 at the batches' size; returns step time and time blocked waiting for data."""
    import torch
    from torch import nn

    from ddlkit_pytorch.models import build_model

    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=classes).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    wait = total = 0.0
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        images, labels = next(batches)
        t1 = time.perf_counter()
        loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if step >= warmup:
            wait += t1 - t0
            total += time.perf_counter() - t0
    return {
        "step_time_s": total / steps,
        "data_wait_s": wait / steps,
        "data_wait_fraction": wait / total,
        "images_per_sec": steps * images.shape[0] / total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=480)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--pipeline-batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=4)
    ap.add_argument("--train-warmup", type=int, default=1)
    ap.add_argument("--before", metavar="REF", help="also run this benchmark as it was at git REF, on its code")
    args = ap.parse_args()
    import torch

    from ddlkit.images import resolve_decoder

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "imagenet"
        t0 = time.perf_counter()
        make_dataset(root, args.images, args.classes)
        print(f"made {args.images} JPEGs in {time.perf_counter() - t0:.1f}s")
        size, b, w = args.image_size, args.batch, args.workers
        # PyTorch's workers are forked before TensorFlow is imported into this process
        streams = {
            "baseline_pytorch": epochs_of(baseline_loader(root, size, b, w), False),
            "ddlkit_pytorch": epochs_of(ddlkit_loader(root, "pytorch", size, b, w), True),
        }
        for stream in streams.values():
            next(stream)
        streams["ddlkit_tensorflow"] = epochs_of(ddlkit_loader(root, "tensorflow", size, b, w), True)
        # rounds alternate between the pipelines so that the machine's drift hits all of them
        samples: dict[str, list[float]] = {name: [] for name in streams}
        for r in range(args.rounds):
            for name, stream in streams.items():
                samples[name].append(pipeline_rate(stream, b, args.pipeline_batches, skip=2 * w + 1))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in samples.items()) + " images/s")
        rates = {name: summary(v) for name, v in samples.items()}
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        train = {
            name: train_with(streams[name], args.train_steps, args.train_warmup, args.classes)
            for name in ("baseline_pytorch", "ddlkit_pytorch")
        }
        for name, r in train.items():
            print(
                f"resnet18 {size}px with {name}: step {r['step_time_s']:.2f}s, data wait "
                f"{100 * r['data_wait_fraction']:.1f}% ({r['images_per_sec']:.1f} images/s)"
            )
    payload = {
        "benchmark": "input_pipeline",
        "config": vars(args),
        "decoder": resolve_decoder("auto"),
        "pipeline_images_per_sec": rates,
        "ratio_pytorch": rates["ddlkit_pytorch"]["median"] / rates["baseline_pytorch"]["median"],
        "ratio_tensorflow": rates["ddlkit_tensorflow"]["median"] / rates["baseline_pytorch"]["median"],
        "goal_ratio": 1.0,
        "training_resnet18": train,
        "goal_data_wait_fraction": 0.05,
    }
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "before"]
            then = run_before(args.before, "input_pipeline.py", argv, Path(tmp))
        payload["before"] = {
            "ref": args.before,
            "pipeline_images_per_sec": then["pipeline_images_per_sec"],
            "ratio_pytorch": then["ratio_pytorch"],
            "ratio_tensorflow": then["ratio_tensorflow"],
            "now_over_before_pytorch": payload["ratio_pytorch"] / then["ratio_pytorch"],
            "now_over_before_tensorflow": payload["ratio_tensorflow"] / then["ratio_tensorflow"],
        }
        print(
            f"now / before {args.before} (each as ddlkit / baseline): pytorch "
            f"{payload['before']['now_over_before_pytorch']:.3f}, tensorflow "
            f"{payload['before']['now_over_before_tensorflow']:.3f}"
        )
    path = write_result("input_pipeline", payload)
    print(
        f"ratio pytorch {payload['ratio_pytorch']:.2f}x, tensorflow {payload['ratio_tensorflow']:.2f}x "
        f"(goal >= 1.0); ddlkit data wait {100 * train['ddlkit_pytorch']['data_wait_fraction']:.1f}% "
        f"(goal < 5%) -> {path}"
    )


if __name__ == "__main__":
    main()
