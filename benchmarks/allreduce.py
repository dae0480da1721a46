"""Why the backends scale differently: one all-reduce of ResNet-18's gradients on 2 ranks.

``benchmarks/scaling.py`` shows dist=horovod reaching ~0.95 scaling efficiency at 2 ranks on
this 2-core machine, PyTorch's dist=native less, and TensorFlow's dist=native much less. Each
step all-reduces the whole gradient (ResNet-18 with 100 classes: 11.2 M float32, 45 MB), so the
collective's speed decides it. This measures that collective alone, with each backend's own
transport, on the same 2 ranks (``mpirun -np 2``, 1 thread each), the same tensors:

* ``torch-gloo``: ``torch.distributed.all_reduce`` over gloo (TCP): what ``dist=native`` uses
  for PyTorch on CPUs (DDP, in 25 MB buckets);
* ``horovod-mpi``: ``hvd.grouped_allreduce`` (MPI, shared memory between the ranks on one
  host): what ``dist=horovod`` uses (skipped when Horovod is not installed);
* ``tf-mwms``: ``MultiWorkerMirroredStrategy``'s ``all_reduce`` of the gradient list (a ring
  over gRPC): what ``dist=native`` uses for TensorFlow.

Ratios are against torch-gloo. ``ddlkit``'s own control plane carries only scalars (metrics,
the stop flag) and is measured in scaling.json (``stop_check``).

    python benchmarks/allreduce.py [--repeats 10]

Writes benchmarks/results/allreduce.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

from _common import summary, write_result

KINDS = ("torch-gloo", "horovod-mpi", "tf-mwms")


def gradient_shapes() -> list[list[int]]:
    """The shapes of ResNet-18's trainable parameters (100 classes), i.e. of its gradients."""
    from ddlkit_pytorch.models import build_model

    return [list(p.shape) for p in build_model("resnet18", num_classes=100).parameters()]


def worker(kind: str, shapes: list[list[int]], repeats: int, port: int) -> None:
    """One rank (started by mpirun): time ``repeats`` all-reduces, rank 0 prints seconds as JSON."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if kind == "tf-mwms":
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{port + r}" for r in range(size)]},
                "task": {"type": "worker", "index": rank},
            }
        )
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            grads = [tf.random.normal(s) for s in shapes]

        @tf.function
        def once():
            return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", grads))

        def run() -> None:
            out = once()
            out[0].numpy()  # wait for the result
    else:
        import torch

        torch.set_num_threads(1)
        grads = [torch.randn(s) for s in shapes]
        if kind == "torch-gloo":
            import torch.distributed as tdist

            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            tdist.init_process_group("gloo", rank=rank, world_size=size)
            # as DDP does: the gradients flattened into buckets of 25 MB, one all-reduce each
            buckets, current = [], []
            for g in grads:
                current.append(g)
                if sum(t.numel() for t in current) * 4 >= 25 << 20:
                    buckets.append(torch.cat([t.reshape(-1) for t in current]))
                    current = []
            if current:
                buckets.append(torch.cat([t.reshape(-1) for t in current]))

            def run() -> None:
                for bucket in buckets:
                    tdist.all_reduce(bucket)
        else:
            import horovod.torch as hvd

            hvd.init()

            def run() -> None:
                hvd.grouped_allreduce_(grads, op=hvd.Sum)

    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print("RESULT " + json.dumps(times), flush=True)


def launch(kind: str, repeats: int) -> list[float]:
    from ddlkit.compute.ports import free_ports

    (port,) = free_ports(1)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    proc = subprocess.run(
        [
            "mpirun",
            "-np",
            "2",
            "--oversubscribe",
            "--bind-to",
            "none",
            sys.executable,
            __file__,
            "--worker",
            kind,
            "--repeats",
            str(repeats),
            "--port",
            str(port),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = gradient_shapes()
    if args.worker:
        worker(args.worker, shapes, args.repeats, args.port)
        return
    if shutil.which("mpirun") is None:
        sys.exit("allreduce.py needs OpenMPI's mpirun (apt-get install openmpi-bin)")
    from ddlkit_pytorch.framework import horovod_problem

    megabytes = sum(4 * math.prod(s) for s in shapes) / 1e6
    results, skipped = {}, {}
    for kind in KINDS:
        if kind == "horovod-mpi" and (why := horovod_problem()):
            skipped[kind] = why
            continue
        seconds = launch(kind, args.repeats)
        results[kind] = {**summary(seconds), "gb_per_s": round(megabytes / 1e3 / statistics.median(seconds), 3)}
        print(
            f"{kind}: {1e3 * results[kind]['median']:.1f} ms per all-reduce of {megabytes:.1f} MB "
            f"({results[kind]['gb_per_s']} GB/s)",
            flush=True,
        )
    base = results["torch-gloo"]["median"]
    for r in results.values():
        r["time_vs_torch_gloo"] = round(r["median"] / base, 3)
    path = write_result(
        "allreduce",
        {
            "benchmark": "allreduce",
            "what": "seconds per all-reduce (sum) of ResNet-18's gradients (100 classes) on 2 ranks of this machine, "
            "1 thread per rank, by each dist backend's transport",
            "megabytes": round(megabytes, 2),
            "tensors": len(shapes),
            "repeats": args.repeats,
            "results": results,
            "skipped": skipped,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
