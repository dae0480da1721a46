"""ddlkit's PyTorch training throughput against a hand-written loop, in one process.

Both sides train the same model on the same synthetic batch with the same optimizer, batch
size and thread count; both exclude the same warm-up steps. ddlkit runs its real worker
code path (job file -> Run -> plugin -> loggers -> checkpoint at the end); rounds alternate
between the two so machine drift hits both equally. Goal: ratio >= 0.98.

With ``--before REF`` the benchmark also runs as it was at git REF, on that revision's code
(``_common.run_before``); the JSON gains ``before``, with ``now_over_before``: this run's ratio
over that run's (each against its own hand-written loop, which absorbs the drift between them).

    python benchmarks/overhead_pytorch.py [--model resnet18 --image-size 64 --batch 32 --steps 40 --rounds 3]
        [--before REF]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import make_job, run_before, run_worker, summary, write_result


def baseline(model_name: str, image_size: int, batch: int, steps: int, warmup: int, classes: int) -> float:
    """The loop a user would write by hand."""
    import torch
    from torch import nn

    from ddlkit_pytorch.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name, num_classes=classes)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.randn(batch, 3, image_size, image_size)
    labels = torch.randint(0, classes, (batch,))
    times = []
    for step in range(steps):
        for g in opt.param_groups:  # a real loop sets the scheduled lr each step too
            g["lr"] = 0.01
        loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 9:
            loss.item()  # the same host syncs ddlkit does for logging
        times.append(time.perf_counter())
    return (steps - warmup - 1) * batch / (times[-1] - times[warmup])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", metavar="REF", help="also run this benchmark as it was at git REF, on its code")
    args = ap.parse_args()

    overrides = [
        "framework=pytorch",
        f"model={args.model}",
        f"data.image_size={args.image_size}",
        f"data.num_classes={args.classes}",
        f"data.length={args.batch * args.steps}",
        f"trainer.batch_size={args.batch}",
        "trainer.epochs=1",
        f"trainer.warmup_steps={args.warmup}",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.resume=false",
        "trainer.log_every=10",
    ]
    ddlkit_ips, base_ips = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            job_file = make_job(Path(tmp) / f"round{r}", overrides)
            ddlkit_ips.append(run_worker(job_file)["images_per_sec"])
            base_ips.append(baseline(args.model, args.image_size, args.batch, args.steps, args.warmup, args.classes))
            print(f"round {r + 1}: ddlkit {ddlkit_ips[-1]:.1f} img/s, hand-written {base_ips[-1]:.1f} img/s")
    d, b = summary(ddlkit_ips), summary(base_ips)
    ratio = d["median"] / b["median"]
    before = {}
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "before"]
            then = run_before(args.before, "overhead_pytorch.py", argv, Path(tmp))
        before = {
            "before": {
                "ref": args.before,
                "ddlkit_images_per_sec": then["ddlkit_images_per_sec"],
                "baseline_images_per_sec": then["baseline_images_per_sec"],
                "ratio": then["ratio"],
                "now_over_before": ratio / then["ratio"],
            }
        }
        print(
            f"ratio now {ratio:.3f}, at {args.before} {then['ratio']:.3f}: now / before = {ratio / then['ratio']:.3f}"
        )
    path = write_result(
        "overhead_pytorch",
        {
            "benchmark": "overhead_pytorch",
            "config": vars(args),
            "ddlkit_images_per_sec": d,
            "baseline_images_per_sec": b,
            "ratio": ratio,
            "goal": 0.98,
            **before,
        },
    )
    print(f"ratio ddlkit / hand-written = {ratio:.3f} (goal >= 0.98) -> {path}")


if __name__ == "__main__":
    main()
