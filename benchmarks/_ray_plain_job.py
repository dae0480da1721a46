"""The baseline of ``benchmarks/ray_target.py`` (a): a training job written by hand for Ray, as a user
without ddlkit would write it, submitted with ``ray job submit --working-dir <this directory> --
python _ray_plain_job.py ...``. The entrypoint (the Ray job's driver) places one bundle per node
(a ``STRICT_SPREAD`` placement group), starts one actor per rank in it, and the actors train the
model ddlkit's PyTorch job trains (``ddlkit_pytorch.models.resnet18``, or a tiny net with
``--model tiny``) with DDP over gloo: SGD with momentum 0.9, one batch of synthetic images per rank.

Rank 0 appends the Unix time of its first step to ``<marks>/first-steps`` and prints
``first step done``; at the end it writes the images/sec after ``--warmup`` steps to ``<marks>/rate``.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

FIRST_STEP = "first step done"


def build_model(name: str, classes: int):  # no return annotation: torch is imported in the actor only
    import torch

    if name == "resnet18":
        from ddlkit_pytorch.models import resnet18

        return resnet18(num_classes=classes)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, classes),
    )


@ray.remote
class Rank:
    def address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def train(self, rank: int, world: int, master: tuple[str, int], args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(0)
        model = DistributedDataParallel(build_model(args.model, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        torch.manual_seed(rank)
        x = torch.randn(args.batch, 3, args.image_size, args.image_size)
        y = torch.randint(0, 10, (args.batch,))
        marks = Path(args.marks)
        t_start = None
        for step in range(1, args.steps + 1):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if step == 1 and rank == 0:
                with open(marks / "first-steps", "a") as f:
                    f.write(f"{time.time()}\n")
                print(FIRST_STEP, flush=True)
            if step == args.warmup:
                t_start = time.perf_counter()
        if rank == 0 and t_start is not None and args.steps > args.warmup:
            rate = (args.steps - args.warmup) * args.batch * world / (time.perf_counter() - t_start)
            (marks / "rate").write_text(str(rate))
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--cpus-per-rank", type=float, default=1.0)
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--marks", required=True)
    args = parser.parse_args()
    ray.init()  # the cluster this Ray job runs on
    pg = placement_group([{"CPU": args.cpus_per_rank}] * args.ranks, strategy="STRICT_SPREAD")
    ray.get(pg.ready())
    ranks = [
        Rank.options(
            num_cpus=args.cpus_per_rank,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
        ).remote()
        for i in range(args.ranks)
    ]
    master = ray.get(ranks[0].address.remote())
    ray.get([r.train.remote(i, args.ranks, master, args) for i, r in enumerate(ranks)])
    print("done", flush=True)


if __name__ == "__main__":
    main()
