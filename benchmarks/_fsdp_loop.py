"""The hand-written baseline of ``benchmarks/fsdp.py``: a plain FSDP2 training loop over gloo, as a
user writes it for ``torchrun`` -- no framework.

The same model (``ddlkit_pytorch.vit``'s ViT, built for the images' size, from seed 0), each
``EncoderBlock`` sharded with ``fully_shard`` and then the whole model (what ``dist=fsdp`` shards),
parameters resharded after the forward pass (torch's default and ddlkit's), ``torch.optim.AdamW``
with ddlkit's ``optimizer=adamw`` defaults, cross-entropy; the same synthetic images as ddlkit's
(its generator, seeded by rank as ddlkit's loader is: a pool of distinct batches, cycled), the
same per-rank batch, one intra-op thread. Images/sec as ddlkit measures them: the first
``--warmup`` steps excluded. Rank 0 prints one JSON line: ``{"images_per_sec": ...,
"peak_memory_mib": ..., "world_size": ...}`` (the peak RSS, the largest over the ranks, as
ddlkit's ``result.json`` has it).

    python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/_fsdp_loop.py \\
        --model vit_b_16 --steps 10 --batch 8 --image-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--classes", type=int, default=100)
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ddlkit.images import SyntheticImages
    from ddlkit_pytorch import vit

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = vit.MODELS[args.model](image_size=args.image_size, num_classes=args.classes)
    mesh = init_device_mesh("cpu", (world,))
    for block in [m for m in model.modules() if isinstance(m, vit.EncoderBlock)]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
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
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])  # KiB on Linux
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        ips = (args.steps - args.warmup) * args.batch * world / elapsed
        print(
            json.dumps({"images_per_sec": ips, "peak_memory_mib": round(float(peak), 1), "world_size": world}),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
