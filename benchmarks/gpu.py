"""ResNet-50 on one GPU: ddlkit's PyTorch throughput against a hand-written loop and against the
seed's V100 (357 images/s: one V100, fp32, batch 64, TensorFlow 1.8, synthetic data).

Parts (``--parts``, any of them, comma-separated):

* ``eager``: synthetic data at 224 px, per-GPU batch 64 and 256, fp32 / bf16 / fp16 (AMP with
  loss scaling), ``channels_last`` off and on; then the largest power-of-two batch that fits
  (probed per precision) with ``channels_last`` on, where it is above 256.
* ``compile``: the same with ``framework.compile=true`` (batch ``--compile-batches``).
* ``imagefolder``: ``data=imagefolder`` on generated photo-like JPEGs (ImageNet's typical sizes,
  quality 90) cropped to 224 px, decoded on the CPU (``data.decoder=pil``/``simplejpeg``, in the
  loader's worker processes) and on the GPU (``data.decoder=gpu``, nvJPEG), eager and compiled
  (``--imagefolder-configs``), against synthetic data at the same settings: images/s, the share of
  the measured time the training loop spent blocked waiting for its next batch, and the CPU cores
  the loader's worker processes kept busy. First, the GPU decoder alone on batches of those files
  (``decode_only``).

A run on another card than the one ``results/gpu.json`` was merged from is kept apart:
``results/gpu-h200-imagefolder.json`` and ``results/gpu-h200-compile.json`` (one H200, 16 cores).

Each configuration runs ddlkit's real worker in this process (job file -> Run -> plugin) and then
the loop a user would write by hand (same model, optimizer, batch, precision, layout, compile
and ``cudnn.benchmark``), alternating which goes first. Both are timed alike: a timestamp after
each step is queued, the loss read every 10 steps (ddlkit's logging), warm-up steps excluded
(they include torch.compile's compilation). The hand-written loop is also timed with the GPU
synchronized at both ends of its window (``synced_images_per_sec``). fp32 is PyTorch's default:
cuDNN convolutions use TF32 tensor cores, matrix products do not.

    python benchmarks/gpu.py                       # every part -> results/gpu.json
    python benchmarks/gpu.py --parts eager         # one part  -> results/gpu_eager.json
    python benchmarks/gpu.py --merge               # results/gpu_*.json -> results/gpu.json + gpu.png
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import RESULTS, make_job, run_worker, save_photo_like, write_result

#: the seed's reference: tf_cnn_benchmarks, ResNet-50, one V100, fp32, batch 64, TF 1.8
V100_REFERENCE = 357.0
PRECISIONS = ("fp32", "bf16", "fp16")


# ---------------------------------------------------------------------------- the machine
def machine() -> dict[str, Any]:
    import importlib.metadata

    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
        "cpus": len(os.sched_getaffinity(0)),
    }
    for package in ("torchvision", "pillow", "simplejpeg", "numpy", "triton"):  # what the device had installed
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[package] = importlib.metadata.version(package)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
        )
        with contextlib.suppress(Exception):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            driver, clock, power = (v.strip() for v in out.splitlines()[0].split(","))
            info.update(driver=driver, max_sm_clock=clock, power_limit=power)
    return info


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------------------- the two loops
def ddlkit_overrides(
    a: argparse.Namespace, batch: int, precision: str, channels_last: bool, compile: bool, steps: int
) -> list[str]:
    return [
        "framework=pytorch",
        f"framework.device={a.device}",
        f"model={a.model}",
        f"trainer.batch_size={batch}",
        "trainer.epochs=1",
        f"trainer.warmup_steps={a.warmup}",
        "trainer.validate=false",
        "trainer.save_model=false",
        "trainer.resume=false",
        "trainer.log_every=10",
        f"trainer.precision={precision}",
        f"framework.channels_last={str(channels_last).lower()}",
        f"framework.compile={str(compile).lower()}",
    ]


def synthetic(a: argparse.Namespace, batch: int, steps: int) -> list[str]:
    return [
        "data=synthetic",
        f"data.image_size={a.image_size}",
        f"data.num_classes={a.classes}",
        f"data.length={batch * steps}",
    ]


def run_ddlkit(job_dir: Path, overrides: list[str]) -> dict[str, Any]:
    free_memory()
    t0 = time.perf_counter()
    result = run_worker(make_job(job_dir, overrides))
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    if "compile=true" in " ".join(overrides):
        import torch

        torch._dynamo.reset()
    return result


def handwritten(
    a: argparse.Namespace, batch: int, precision: str, channels_last: bool, compile: bool, steps: int
) -> dict[str, Any]:
    """The loop a user would write by hand, timed the way ddlkit's meter times its own."""
    import torch
    from torch import nn

    from ddlkit_pytorch.models import AutocastForward, build_model

    free_memory()
    device = torch.device("cuda" if a.device in ("auto", "cuda") and torch.cuda.is_available() else a.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = cuda
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = build_model(a.model, num_classes=a.classes).to(device, memory_format=fmt).train()
    # fused on CUDA, as ddlkit's framework.optimizer_kernel=auto steps there
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, fused=cuda or None)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.randn(batch, 3, a.image_size, a.image_size, device=device).contiguous(memory_format=fmt)
    labels = torch.randint(0, a.classes, (batch,), device=device)
    # compiled: autocast inside the compiled module, as the plugin does (under an ambient autocast
    # alone, torch 2.11 reuses the graph compiled for an earlier bf16 run in a later fp16 one)
    net = torch.compile(AutocastForward(model, device.type, dtype) if dtype else model) if compile else model
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ticks: list[float] = []
    t_start = 0.0
    for step in range(1, steps + 1):
        for g in opt.param_groups:  # a real loop sets the scheduled lr each step too
            g["lr"] = 0.1
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(net(images), labels)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        ticks.append(time.perf_counter())
        if step % 10 == 0 or step == steps:
            loss.item()  # ddlkit's logging steps read the loss (a sync)
        if step == a.warmup:
            sync()
            t_start = time.perf_counter()
    sync()
    t_end = time.perf_counter()
    measured = steps - a.warmup
    out = {
        "images_per_sec": measured * batch / (ticks[-1] - ticks[a.warmup - 1]),
        "synced_images_per_sec": measured * batch / (t_end - t_start),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "final_loss": loss.item(),
    }
    del net, model, opt, images, labels, loss
    if compile:
        torch._dynamo.reset()
    return out


def fits(a: argparse.Namespace, batch: int, precision: str) -> bool:
    """Whether two training steps at ``batch`` fit in the GPU's memory (channels_last)."""
    import torch

    ok = True
    try:
        handwritten(argparse.Namespace(**{**vars(a), "warmup": 1}), batch, precision, True, False, 2)
    except torch.OutOfMemoryError:
        ok = False
    free_memory()  # after the except block, which holds the failed step's tensors
    return ok


# ---------------------------------------------------------------------------- one configuration
def measure(
    a: argparse.Namespace, tmp: Path, n: int, batch: int, precision: str, channels_last: bool, compile: bool
) -> dict[str, Any]:
    steps = a.warmup + max(a.min_measured, round(a.steps * 64 / batch))
    row: dict[str, Any] = {
        "batch": batch,
        "precision": precision,
        "channels_last": channels_last,
        "compile": compile,
        "steps": steps,
        "warmup_steps": a.warmup,
    }
    overrides = ddlkit_overrides(a, batch, precision, channels_last, compile, steps) + synthetic(a, batch, steps)
    runs: dict[str, Callable[[], Any]] = {
        "ddlkit": lambda: run_ddlkit(tmp / f"job{n}", overrides),
        "handwritten": lambda: handwritten(a, batch, precision, channels_last, compile, steps),
    }
    for name in ("ddlkit", "handwritten") if n % 2 == 0 else ("handwritten", "ddlkit"):
        try:
            row[name] = runs[name]()
        except Exception as err:  # one configuration failing must not lose the others
            row[name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            traceback.print_exc()
            free_memory()
    d, h = row["ddlkit"].get("images_per_sec"), row["handwritten"].get("images_per_sec")
    if d:
        row["ddlkit"] = {
            k: row["ddlkit"].get(k)
            for k in (
                "images_per_sec",
                "measured_steps",
                "final_loss",
                "device",
                "device_name",
                "loss_scale",
                "wall_s",
                "data_wait_fraction",
            )
            if row["ddlkit"].get(k) is not None
        }
        row["ddlkit_vs_v100"] = round(d / V100_REFERENCE, 2)
    if h:
        row["handwritten_vs_v100"] = round(h / V100_REFERENCE, 2)
    if d and h:
        row["ratio"] = round(d / h, 3)
    print(
        f"b{batch} {precision} cl={int(channels_last)} compile={int(compile)}: ddlkit {d or 0:.0f} img/s, "
        f"hand-written {h or 0:.0f} img/s, ratio {row.get('ratio', float('nan')):.3f}, "
        f"x{(d or 0) / V100_REFERENCE:.2f} the V100",
        flush=True,
    )
    return row


def matrix(
    a: argparse.Namespace,
    tmp: Path,
    batches: list[int],
    compile: bool,
    save: Callable[[], None],
    rows: list[dict[str, Any]],
    layouts: tuple[bool, ...] = (False, True),
    precisions: tuple[str, ...] = PRECISIONS,
) -> None:
    for batch in batches:
        for precision in precisions:
            for cl in layouts:
                rows.append(measure(a, tmp, len(rows), batch, precision, cl, compile))
                save()


# ---------------------------------------------------------------------------- image folder
def _make_image(args: tuple[Path, int]) -> None:
    save_photo_like(*args)


def make_folder(root: Path, unique: list[Path], n: int, classes: int) -> Path:
    """``n`` training images in ``classes`` folders: hard links to the ``unique`` JPEGs in turn
    (decoding a link costs what decoding a distinct file does; both are in the page cache)."""
    for i in range(n):
        folder = root / "train" / f"n{i % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        os.link(unique[i % len(unique)], folder / f"{i:07d}.JPEG")
    return root


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of the loader's worker processes (this process's children; psutil, empty
    without it)."""
    try:
        import psutil
    except ImportError:
        return {}
    me = psutil.Process()
    workers = 0.0
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            workers += sum(child.cpu_times()[:2])
    return {"workers": workers, "t": time.perf_counter()}


@contextlib.contextmanager
def timed_batches(waits: list[float], cpu: list[dict[str, float]], warmup: int) -> Iterator[None]:
    """Record how long the training loop blocks in ``next(batch)`` for each batch, and the input
    pipeline's CPU seconds from the start of the measured steps on."""
    from ddlkit_pytorch import data, imagefolder

    originals = {cls: cls.iter_epoch for cls in (imagefolder.TorchImageLoader, data.PooledLoader)}

    def wrap(method: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def iter_epoch(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            it = method(self, *args, **kwargs)
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                waits.append(time.perf_counter() - t0)
                # when the measured steps start, then every 10 steps
                if len(waits) >= warmup and (len(waits) - warmup) % 10 == 0:
                    cpu.append(cpu_seconds())
                yield batch

        return iter_epoch

    for cls, method in originals.items():
        cls.iter_epoch = wrap(method)
    try:
        yield
    finally:
        for cls, method in originals.items():
            cls.iter_epoch = method


def cores_busy(cpu: list[dict[str, float]]) -> dict[str, float]:
    """Cores the input pipeline kept busy over the measured steps."""
    if len(cpu) < 2 or not cpu[0] or not cpu[-1]:
        return {}
    first, last = cpu[0], cpu[-1]
    span = last["t"] - first["t"]
    return {"workers_cores": round((last["workers"] - first["workers"]) / span, 2)}


def decode_only(a: argparse.Namespace, files: list[Path], batch: int) -> dict[str, Any]:
    """data.decoder=gpu's rank side alone: nvJPEG on ``batch`` files, then crop, resize, flip and
    normalize, as a training step would ask for them (files read beforehand)."""
    import torch

    from ddlkit.images import Augment, crop_window, sample_rng
    from ddlkit_pytorch.gpu_decode import DeviceDecoder, Encoded, nvjpeg

    device = torch.device("cuda")
    aug = Augment(a.image_size, True, round(a.image_size / 0.875), decoder="pil", device_decoding=True)
    blobs = [p.read_bytes() for p in files[:batch]]
    windows = [crop_window(b, aug, sample_rng(0, 0, i)) for i, b in enumerate(blobs)]
    keep = [i for i, w in enumerate(windows) if w is not None]
    sizes = torch.tensor([0] + [len(blobs[i]) for i in keep])
    enc = Encoded(
        torch.frombuffer(bytearray(b"".join(blobs[i] for i in keep)), dtype=torch.uint8).pin_memory(),
        sizes.cumsum(0),
        torch.tensor([windows[i][0] for i in keep]),
        torch.tensor([windows[i][1] for i in keep]),
        torch.empty((0, 1, 1, 3), dtype=torch.uint8),
        torch.full((len(keep),), -1),
        torch.tensor(keep),
        0,
    )

    def cpu_image(index: int, epoch: int) -> Any:
        raise RuntimeError(f"nvJPEG could not decode {files[index]}")

    decoder = DeviceDecoder(a.image_size, device, True, nvjpeg(device), cpu_image)
    labels = torch.zeros(len(keep), dtype=torch.int64)
    for _ in range(3):
        decoder(enc, labels)
    torch.cuda.synchronize()
    rounds, t0 = 10, time.perf_counter()
    for _ in range(rounds):
        decoder(enc, labels)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {
        "batch": len(keep),
        "images_per_sec": round(rounds * len(keep) / seconds),
        "ms_per_batch": round(1e3 * seconds / rounds, 2),
    }


def imagefolder(
    a: argparse.Namespace, tmp: Path, save: Callable[[], None], rows: list[dict[str, Any]], payload: dict[str, Any]
) -> None:
    from multiprocessing import Pool

    from ddlkit.images import resolve_decoder

    t0 = time.perf_counter()
    unique = [tmp / "unique" / f"{i:05d}.JPEG" for i in range(a.unique_images)]
    with Pool(len(os.sched_getaffinity(0))) as pool:
        pool.map(_make_image, [(p, i) for i, p in enumerate(unique)], chunksize=16)
    mb = sum(p.stat().st_size for p in unique) / len(unique) / 1e3
    print(f"made {len(unique)} JPEGs ({mb:.0f} kB each) in {time.perf_counter() - t0:.1f}s", flush=True)
    decoders = {"cpu": resolve_decoder("auto"), "gpu": "gpu"}
    if "gpu" in a.decoders.split(","):
        try:
            payload["decode_only"] = decode_only(a, unique, 256)
        except Exception as err:
            payload["decode_only"] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            traceback.print_exc()
        print(f"GPU decoding alone: {payload['decode_only']}", flush=True)
        save()
    for n, spec in enumerate(a.imagefolder_configs.split(",")):
        precision, batch_s, layout, *mode = spec.split(":")
        batch, cl, compile = int(batch_s), layout == "cl", mode == ["compile"]
        steps = a.warmup + max(a.min_measured, round(a.steps * 64 / batch))
        root = make_folder(tmp / f"folder{n}", unique, batch * steps, a.classes)
        row: dict[str, Any] = {
            "batch": batch,
            "precision": precision,
            "channels_last": cl,
            "compile": compile,
            "steps": steps,
            "warmup_steps": a.warmup,
            "workers_available": len(os.sched_getaffinity(0)),
            "unique_images": len(unique),
            "kb_per_image": round(mb),
        }
        rows.append(row)
        base = ddlkit_overrides(a, batch, precision, cl, compile, steps)
        runs = [("synthetic", synthetic(a, batch, steps))] + [
            (
                f"decoder_{d}",
                [
                    "data=imagefolder",
                    f"data.root={root}",
                    f"data.image_size={a.image_size}",
                    f"data.decoder={decoders[d]}",
                ],
            )
            for d in a.decoders.split(",")
        ]
        for name, data in runs:
            waits: list[float] = []
            cpu: list[dict[str, float]] = []
            try:
                with timed_batches(waits, cpu, a.warmup):
                    r = run_ddlkit(tmp / f"if{n}-{name}", base + data)
                measured_time = r["measured_steps"] * batch / r["images_per_sec"]
                # the batches of the measured steps: those after the warm-up ones
                row[name] = {
                    "images_per_sec": r["images_per_sec"],
                    "measured_steps": r["measured_steps"],
                    "data_wait_fraction": round(sum(waits[a.warmup :]) / measured_time, 4),
                    "data_wait_ms_per_step": round(1e3 * sum(waits[a.warmup :]) / r["measured_steps"], 2),
                    "vs_v100": round(r["images_per_sec"] / V100_REFERENCE, 2),
                    "wall_s": r["wall_s"],
                    **cores_busy(cpu),
                    **{k: r[k] for k in ("decoder", "gpu_decoded_images", "cpu_decoded_images") if k in r},
                }
            except Exception as err:
                row[name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
                traceback.print_exc()
            if "images_per_sec" in row[name] and "images_per_sec" in row["synthetic"] and name != "synthetic":
                row[f"ratio_{name}_to_synthetic"] = round(
                    row[name]["images_per_sec"] / row["synthetic"]["images_per_sec"], 3
                )
            print(
                f"imagefolder b{batch} {precision} cl={int(cl)} compile={int(compile)} {name}: "
                f"{row[name].get('images_per_sec', 0):.0f} img/s, wait "
                f"{100 * row[name].get('data_wait_fraction', 0):.1f}%, "
                f"worker cores {row[name].get('workers_cores', '?')}, "
                f"wall {row[name].get('wall_s', '?')}s",
                flush=True,
            )
            save()


# ---------------------------------------------------------------------------- merge and plot
def merge() -> Path:
    parts = sorted(p for p in RESULTS.glob("gpu_*.json"))
    payload: dict[str, Any] = {}
    for p in parts:
        d = json.loads(p.read_text())
        for k, v in d.items():
            if isinstance(v, list):
                payload.setdefault(k, []).extend(v)
            elif k in ("config", "parts"):
                payload.setdefault(k, {})[p.stem] = v
            else:
                payload.setdefault(k, v)
    payload.get("synthetic", []).sort(key=order)
    path = RESULTS / "gpu.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    plot(payload)
    return path


def order(row: dict[str, Any]) -> tuple:
    return row["compile"], row["batch"], PRECISIONS.index(row["precision"]), row["channels_last"]


def plot(payload: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in payload.get("synthetic", []) if r["ddlkit"].get("images_per_sec") and not r.get("invalid")]
    if not rows:
        return
    labels = [
        f"b{r['batch']} {r['precision']}{' cl' if r['channels_last'] else ''}{' comp' if r['compile'] else ''}"
        for r in rows
    ]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows)), 5))
    ax.bar([i - 0.2 for i in x], [r["ddlkit"]["images_per_sec"] for r in rows], 0.4, label="ddlkit")
    ax.bar(
        [i + 0.2 for i in x],
        [r["handwritten"].get("images_per_sec", 0) for r in rows],
        0.4,
        label="hand-written PyTorch",
    )
    ax.axhline(V100_REFERENCE, color="k", ls="--", lw=1, label=f"seed: V100 fp32 b64 ({V100_REFERENCE:.0f})")
    ax.set_xticks(list(x), labels, rotation=70, ha="right", fontsize=8)
    ax.set_ylabel("images/s")
    m = payload.get("machine_gpu", {})
    ax.set_title(f"ResNet-50, synthetic 224 px, one {m.get('gpu', 'GPU')} (torch {m.get('torch', '?')})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "gpu.png", dpi=110)


# ---------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="eager,compile,imagefolder")
    ap.add_argument("--merge", action="store_true", help="combine results/gpu_*.json into results/gpu.json")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--compile-batches", default="256")
    ap.add_argument("--compile-layouts", default="off,on", help="channels_last settings of the compiled runs")
    ap.add_argument("--compile-precisions", default=",".join(PRECISIONS), help="precisions of the compiled runs")
    ap.add_argument("--probe", default="512,1024", help="batches above 256 to try for the largest that fits")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=80, help="measured steps at batch 64 (scaled by 64/batch above)")
    ap.add_argument("--min-measured", type=int, default=40)
    ap.add_argument("--unique-images", type=int, default=2048)
    ap.add_argument(
        "--imagefolder-configs",
        default="bf16:256:cl:eager,bf16:256:cl:compile",
        help="precision:batch:layout:eager|compile, comma-separated",
    )
    ap.add_argument("--decoders", default="cpu,gpu", help="image-folder decoders to run: cpu, gpu")
    a = ap.parse_args()
    if a.merge:
        print(merge())
        return
    parts = a.parts.split(",")
    name = "gpu" if set(parts) == {"eager", "compile", "imagefolder"} else "gpu_" + "_".join(parts)
    payload: dict[str, Any] = {
        "benchmark": "gpu",
        "machine_gpu": machine(),
        "config": vars(a),
        "v100_reference_images_per_sec": V100_REFERENCE,
    }
    print(json.dumps(payload["machine_gpu"]), flush=True)

    def save() -> None:
        write_result(name, payload)

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp / "inductor"))
        batches = [int(b) for b in a.batches.split(",")]
        if "eager" in parts:
            rows = payload.setdefault("synthetic", [])
            matrix(a, tmp, batches, False, save, rows)
            largest: dict[str, int] = {}
            for precision in ("fp32", "bf16"):
                largest[precision] = max(batches)
                for b in (int(v) for v in a.probe.split(",") if v):
                    if not fits(a, b, precision):
                        break
                    largest[precision] = b
            largest["fp16"] = largest["bf16"]
            payload["largest_batch_that_fits"] = largest
            print(f"largest power-of-two batch that fits (channels_last): {largest}", flush=True)
            save()
            for precision, b in largest.items():
                if b > max(batches):
                    matrix(a, tmp, [b], False, save, rows, layouts=(True,), precisions=(precision,))
        if "compile" in parts:
            rows = payload.setdefault("synthetic", [])
            layouts = tuple(v == "on" for v in a.compile_layouts.split(","))
            matrix(
                a,
                tmp,
                [int(b) for b in a.compile_batches.split(",")],
                True,
                save,
                rows,
                layouts=layouts,
                precisions=tuple(a.compile_precisions.split(",")),
            )
        if "imagefolder" in parts:
            imagefolder(a, tmp, save, payload.setdefault("imagefolder", []), payload)
    print(f"-> {write_result(name, payload)}")


if __name__ == "__main__":
    main()
