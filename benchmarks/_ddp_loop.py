"""The hand-written baseline of ``benchmarks/ddp_ab.py``: a plain DDP training loop over gloo, as a
user would write it -- no framework -- launched by ``mpirun`` like ddlkit's ``compute=local_mpi``.

The same model (ResNet-18 of ``ddlkit_pytorch.models``, torch's defaults: contiguous memory), the same
synthetic images (ddlkit's generator, seeded by rank as ddlkit's loader is: a pool of distinct
batches, cycled), the same per-rank batch, SGD with momentum; DDP with torch's defaults. One
intra-op thread. Images/sec as ddlkit measures them: the first ``--warmup`` steps excluded.
Rank 0 prints one JSON line: ``{"images_per_sec": ..., "world_size": ...}``.

    mpirun -np 2 python benchmarks/_ddp_loop.py --steps 40 --batch 32 --image-size 64
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--port", type=int, default=29611)
    args = ap.parse_args()
    rank, world = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0)), int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))

    import torch
    import torch.distributed as dist

    from ddlkit.images import SyntheticImages
    from ddlkit_pytorch.models import build_model

    torch.set_num_threads(1)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = build_model(args.model, args.classes)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * args.batch * world / 256, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    images, labels = SyntheticImages(
        batch_size=args.batch,
        image_size=args.image_size,
        num_classes=args.classes,
        batches=args.steps,
        pool_mib=128,
        seed=0,
        stream=(rank, False),
    ).pool
    x = torch.from_numpy(images).movedim(-1, -3).contiguous()
    y = torch.from_numpy(labels)
    model.train()
    started = None
    for step in range(args.steps):
        if step == args.warmup:
            started = time.perf_counter()
        i = step % len(x)
        optimizer.zero_grad()
        loss_fn(model(x[i]), y[i]).backward()
        optimizer.step()
    assert started is not None, "--steps must exceed --warmup"
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(
            json.dumps(
                {"images_per_sec": (args.steps - args.warmup) * args.batch * world / elapsed, "world_size": world}
            ),
            flush=True,
        )
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
