"""The baseline of ``benchmarks/faults.py``: a hand-written DDP training loop for torchrun's elastic
agent, written the usual way -- no framework.

The same model (ResNet-18 of ``ddlkit_pytorch.models``), the same synthetic images (ddlkit's
generator, seeded by rank as ddlkit's loader is), the same per-rank batch, SGD with the learning rate
scaled to the global batch (``lr x batch x world / 256``, as ddlkit's ``optimizer.scale_lr=linear``
with no warm-up). Rank 0 saves a checkpoint every ``--checkpoint-every`` steps with ``torch.save``
(to a temporary file, then renamed) and every start resumes from the newest. Rank 0 appends one JSON
line per optimizer step to ``metrics.jsonl`` in ``--out`` -- ``{"step", "split", "time", "loss"}``,
the fields and clock of ddlkit's ``logger=jsonl`` -- and one ``{"event": "start", ...}`` line per
start (the step it resumed from, the world size), which is how the benchmark observes both sides alike.

    torchrun --nnodes=1:2 --nproc-per-node=1 ... benchmarks/_torchrun_train.py --out DIR --steps 35
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    launched = time.time()  # before torch is imported: how long a start takes, besides the rendezvous
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--pool-mib", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from ddlkit.images import SyntheticImages
    from ddlkit_pytorch.models import resnet18

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    model = resnet18(num_classes=args.num_classes)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr * args.batch * world / 256, momentum=0.9, weight_decay=1e-4
    )
    start = 0
    checkpoints = sorted(args.out.glob("ckpt-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    if checkpoints:
        state = torch.load(checkpoints[-1], map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # the world may have changed: the lr follows the global batch
            group["lr"] = args.lr * args.batch * world / 256
        start = state["step"]
    ddp = DistributedDataParallel(model)

    metrics = open(args.out / "metrics.jsonl", "a", buffering=1) if rank == 0 else None
    if metrics:
        metrics.write(
            json.dumps(
                {
                    "event": "start",
                    "resumed_from": start,
                    "world_size": world,
                    "launched": round(launched, 3),
                    "time": round(time.time(), 3),
                }
            )
            + "\n"
        )
    data = SyntheticImages(
        batch_size=args.batch,
        image_size=args.image_size,
        num_classes=args.num_classes,
        batches=args.steps,
        pool_mib=args.pool_mib,
        seed=args.seed,
        stream=(rank, False),
    )
    images, labels = data.pool
    images = torch.from_numpy(images).permute(0, 1, 4, 2, 3).contiguous()  # NHWC -> NCHW
    labels = torch.from_numpy(labels)

    for step in range(start + 1, args.steps + 1):
        i = (step - 1) % len(images)
        loss = F.cross_entropy(ddp(images[i]), labels[i])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if metrics:
            metrics.write(
                json.dumps({"step": step, "split": "train", "time": round(time.time(), 3), "loss": mean.item() / world})
                + "\n"
            )
            if step % args.checkpoint_every == 0:
                path = args.out / f"ckpt-{step}.pt"
                torch.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                    path.with_suffix(".tmp"),
                )
                os.replace(path.with_suffix(".tmp"), path)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
