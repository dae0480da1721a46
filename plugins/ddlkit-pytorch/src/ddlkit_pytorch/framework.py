"""The PyTorch framework. `requirements.txt` installs its plugin, so the quick start trains with it;
it is registered through the `ddlkit` entry-point group exactly as a
third-party plugin would be.

    pip install torch==2.13.0 -e ./plugins/ddlkit-pytorch     # torch first: the build you want (below)
    ddlkit framework=pytorch model=resnet50 trainer.precision=bf16 framework.channels_last=true

Which torch you get depends on the index: on Linux, `torch==2.13.0` from the default package index
is the CUDA build (it brings about 18 `nvidia-*` packages and `triton`); for the CPU build add
`--index-url https://download.pytorch.org/whl/cpu`. Install the torch you want before the plugin,
so that nothing else pulls another one.

## What it brings

- **Models**, registered for `framework=pytorch`: ResNet-18/34/50/101/152 (`ddlkit_pytorch.models`),
  with `state_dict` keys identical to torchvision's (weights interchange; torchvision's wheels do
  not load against the CPU torch build), and `model=custom`: any `torch.nn.Module` from
  `model.target=package.module:function`, with `model.loss` and `model.metrics` for other tasks
  ([Your own model](../../tutorials/your-own-model.md)).
- **Vision Transformers**: `vit_b_16`, `vit_l_16`, `vit_h_14` (`ddlkit_pytorch.vit`) and `swin_t`,
  `swin_b` (`ddlkit_pytorch.swin`), with torchvision's module tree, `state_dict` keys and
  initialisation: from one seed they compute torchvision's logits. A ViT is built for the data's
  `data.image_size`, which must be a multiple of its patch size (16, or 14 for ViT-H/14); a Swin
  takes any size of at least one 4 px patch. Each transformer block is its own module
  (`EncoderBlock`, `SwinTransformerBlock`): the unit `dist=fsdp` shards and
  `framework.activation_checkpointing` recomputes. `+experiment=vit_b16_imagenet` is
  torchvision's ViT-B/16 ImageNet recipe where ddlkit can express it; its comments list what it
  leaves out (the cosine decay, mixup/cutmix, the weights' moving average).
- **Optimizers**: `sgd` and `adamw` from `torch.optim`, `lamb` and `lars` from
  [pytorch-optimizer](https://pypi.org/project/pytorch-optimizer/) (torch has neither; a
  dependency of this plugin), with ddlkit's shared learning-rate schedule
  ([Optimizers and the learning rate](../training.md)). `framework.optimizer_kernel` picks how
  `sgd` and `adamw` step.
- **Data**: the data sources' framework-neutral batches become tensors on the rank's device;
  `data=imagefolder` gets a `DataLoader` of worker processes that decode whole batches into shared
  memory (normalized in the workers on a CPU, on the GPU otherwise), `data=synthetic` its batches
  copied to the device once. With `data.decoder=gpu` the workers only read files and draw crops
  from the JPEG headers, and the rank decodes with nvJPEG on its GPU ([GPUs](../gpus.md)).
- **Precision**: `trainer.precision=bf16` autocasts on CPU or GPU; `fp16` (GPU only) adds a
  gradient scaler. `framework.channels_last=true` trains in NHWC, `framework.compile=true` with
  `torch.compile`.
- **Threads**: `framework.num_threads=auto` (the default) gives each rank its share of the node's
  cores, and PyTorch ranks also get `OMP_WAIT_POLICY=PASSIVE` unless you set it, because OpenMP
  threads that spin while they wait collapse on a machine whose cores other work uses
  ([Performance](../../explanation/performance.md#threads-per-rank)).
- **Several ranks**: `dist=native` is `torch.distributed` (gloo on the CPU, NCCL bound to the
  rank's GPU) with `DistributedDataParallel`; `dist=horovod` is Horovod's `DistributedOptimizer`
  ([Distributed training](../distributed.md)). DDP's knobs are this framework's options:
  `framework.ddp_bucket_cap_mb`, `framework.ddp_gradient_as_bucket_view` (on by default, unlike
  torch: no gradient copies into the all-reduce buckets, one gradient-sized buffer less per rank)
  and `framework.ddp_static_graph`. `benchmarks/ddp_ab.py` compares them
  ([Performance](../../explanation/performance.md#ddlkits-ddp-is-torchs-ddp)).
  `dist=fsdp` shards the parameters, gradients and optimizer state over the ranks with FSDP2
  (`ddlkit_pytorch.sharded`), block by block (`framework.fsdp_blocks` names your own model's
  blocks, `framework.fsdp_reshard_after_forward` trades memory for all-gathers), with sharded
  checkpoints that load into any number of ranks; `framework.activation_checkpointing=true`
  recomputes each block's activations (any `dist`)
  ([Sharded training](../distributed.md#sharded-training-distfsdp)). With `dist=fsdp` the
  `model` a `ddlkit_run_end` hook sees is the sharded module; `model.pt` holds the full weights.
- **Profiling**: `trainer.profile.start_step=20` runs `torch.profiler` over steps 20-24 on every rank
  (CPU activity, and CUDA's on a GPU; `framework.profile_memory=true` adds the allocations): one
  Chrome/Perfetto trace per rank under the job directory's `profile/` ([Profiling](../profiling.md)).
- **Checkpoints** hold model, optimizer, scaler and RNG state; they are written by ddlkit
  (atomically, in the background) and loaded with `weights_only=True` (with `dist=fsdp`, a
  directory of shards: see above). `trainer.save_model=true`
  writes `model.pt`.

## On CUDA

`cudnn.benchmark` is on for runs that are not deterministic; `trainer.deterministic=true` sets
`CUBLAS_WORKSPACE_CONFIG=:4096:8` for the run (unless set), without which torch refuses every
cuBLAS product. A rank whose local GPU does not exist is refused by name. `framework.compile`
with bf16 or fp16 compiles the autocast with the model (`ddlkit_pytorch.models.AutocastForward`):
torch 2.11's compile cache ignores the dtype of an autocast *around* the compiled module, so an
fp16 run after a bf16 one reused the bf16 graph. `result.json`'s `device` is `cuda:<index>` (or
`cpu`); the plugin adds `device_name`, fp16's final `loss_scale`, `model_state_mib` (rank 0's
parameters, gradients and optimizer state: its shards under `dist=fsdp`), and with `data=imagefolder`
`decoder` (with `data.decoder=gpu`, `gpu_decoded_images` and `cpu_decoded_images`). Running on a
GPU and what was measured there: [GPUs](../gpus.md).

## Tests

`cd plugins/ddlkit-pytorch && python -m pytest`; on a GPU also
`DDLKIT_RUN_GPU_TESTS=1 python -m pytest tests/gpu` there.

## How it works

torch is imported inside methods, so composing a config and `ddlkit plugins` stay fast and work
without torch installed. `ddlkit_pytorch.components` registers the models and optimizers,
`ddlkit_pytorch.data` turns loaders into tensors, `ddlkit_pytorch.imagefolder` builds the
`DataLoader`, and `ddlkit_pytorch.gpu_decode` decodes on the GPU (it needs torchvision built for
the installed torch).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ddlkit
from ddlkit import cpu, threads
from ddlkit.horovod import horovod_built_with
from ddlkit.options import POSITIVE, Rule, checked

from .components import KERNEL_OPTIMIZERS

if TYPE_CHECKING:
    from omegaconf import DictConfig


class OptimizerKernel(StrEnum):
    auto = "auto"
    fused = "fused"
    foreach = "foreach"
    for_loop = "for_loop"


@dataclass
class PytorchConfig:
    # cpu, cuda, cuda:N, or auto (cuda when available)
    device: str = "auto"
    # NHWC memory layout: faster convolutions on recent GPUs and on CPUs with oneDNN
    channels_last: bool = False
    # intra-op threads per rank: auto (the cores this process may use, shared by the ranks of its
    # node; see ddlkit.threads), a number, or 0 for torch's default (all cores)
    num_threads: Any = "auto"
    # torch.compile the model (the first steps get slower, later ones faster)
    compile: bool = False
    # how optimizer=sgd|adamw step: fused (one kernel for all parameters), foreach (a kernel per
    # operation over all tensors), for_loop (per tensor), or auto: fused on a CUDA GPU (ResNet-50 on an
    # H100, compiled, batch 256: 1.006x foreach), torch's default elsewhere
    optimizer_kernel: OptimizerKernel = OptimizerKernel.auto
    # DistributedDataParallel (dist=native, several ranks): MB of gradients per all-reduce bucket
    # (torch's default: 25)
    ddp_bucket_cap_mb: float = checked(25.0, POSITIVE)
    # gradients as views into DDP's all-reduce buckets (torch's default: off): no copy of every
    # gradient into its bucket and back each step, and one gradient-sized buffer less per rank
    # (ResNet-18, 2 ranks on the CPU: peak RSS 737 -> 698 MiB per rank, its 45 MB of gradients)
    ddp_gradient_as_bucket_view: bool = True
    # the model uses the same parameters in every step (the ResNets do): DDP then skips its
    # per-step bookkeeping of which were used; leave it off for models with data-dependent branches
    ddp_static_graph: bool = False
    # the model's blocks: the module classes dist=fsdp shards each on its own and activation
    # checkpointing recomputes (class names, or module.QualName); empty: the model family's blocks
    # (the ResNets' BasicBlock/Bottleneck, the ViTs' EncoderBlock, the Swins' SwinTransformerBlock).
    # Parameters outside them (stem, head) are sharded with the whole model
    fsdp_blocks: list[str] = field(default_factory=list)
    # dist=fsdp: free a block's gathered parameters after its forward pass and gather them again
    # for its backward (the least memory); false keeps them until then (fewer all-gathers)
    fsdp_reshard_after_forward: bool = True
    # dist=fsdp on the CPU, to trade speed for host memory: glibc's malloc serves blocks of at least
    # this many MiB (<= 32) with mmap, which returns them to the system when freed, instead of raising
    # that threshold as such blocks are freed and keeping them in its heap. 1: ViT-B/16, 2 ranks, peak
    # RSS 0.45x at 0.60x the images/sec (each step maps and faults in its gathered blocks anew); ViT-L/16
    # 3.75 -> 2.89 GiB a rank. 0 (default) leaves malloc as it is, as does MALLOC_MMAP_THRESHOLD_ set
    # in the environment
    fsdp_mmap_threshold_mib: int = checked(0, Rule(lambda v: 0 <= v <= 32, "between 0 and 32 (MiB)"))
    # recompute each block's activations in the backward pass instead of keeping them from the
    # forward (any dist; the blocks as for fsdp): less memory for about a third more compute
    activation_checkpointing: bool = False
    # trainer.profile: also record the tensors' memory allocations and frees in the trace (larger traces)
    profile_memory: bool = False


#: how to get a Horovod that trains PyTorch, or what to use instead
HOROVOD_HOW_TO = (
    "Build it against the installed torch with scripts/install_horovod.sh (Horovod 0.28.1 patched to "
    "C++17; about 6 minutes on 2 cores, 9 with TensorFlow installed too, then the wheel is cached), or "
    "use dist=native."
)


def horovod_problem() -> str | None:
    """Why ``dist=horovod`` cannot train PyTorch in this environment, or None if it can."""
    built = horovod_built_with("torch/mpi_lib_v2")
    if built is None:
        return f"dist=horovod with framework=pytorch needs Horovod, which is not installed. {HOROVOD_HOW_TO}"
    if not built:
        return (
            "dist=horovod with framework=pytorch: the installed Horovod was built without PyTorch support. "
            f"{HOROVOD_HOW_TO}"
        )
    return None


class PytorchFramework(ddlkit.Framework):
    model_libraries = {"torch": "a PyTorch module"}
    release_image = True
    backends = ("none", "native", "horovod", "fsdp")
    #: the trained model (the plain module, without DDP/compile wrappers) once :meth:`train` has
    #: returned, for ``ddlkit_run_end`` hooks that export or inspect it
    model: Any = None

    def configure(self, config: DictConfig) -> None:
        if config.trainer.precision == "fp16" and self.cfg.device == "cpu":
            raise cpu.fp16_refusal("pytorch", "framework.device=cpu was chosen")
        kernel, optimizer = self.cfg.optimizer_kernel, (config.get("optimizer") or {}).get("name")
        if kernel != "auto" and optimizer not in KERNEL_OPTIMIZERS:
            raise ddlkit.ConfigError(
                f"framework.optimizer_kernel={kernel} applies to optimizer=sgd or adamw, not "
                f"optimizer={optimizer}: leave it at auto."
            )
        if (config.get("data") or {}).get("decoder") == "gpu" and self.cfg.device == "cpu":
            raise ddlkit.ConfigError(
                "data.decoder=gpu decodes on a CUDA GPU, and framework.device=cpu was chosen: use "
                "framework.device=cuda (or auto) on a machine with one, or data.decoder=auto."
            )
        threads.check(self.cfg.num_threads, "torch")
        fsdp = config.dist.backend == "fsdp"
        if fsdp and config.trainer.precision == "fp16":
            raise ddlkit.ConfigError(
                "dist=fsdp trains in fp32 or bf16 (its gradients are reduced in fp32), not "
                "trainer.precision=fp16: use trainer.precision=bf16."
            )
        if self.cfg.fsdp_blocks and not (fsdp or self.cfg.activation_checkpointing):
            raise ddlkit.ConfigError(
                f"framework.fsdp_blocks names the blocks dist=fsdp shards and activation checkpointing "
                f"recomputes, and this run has neither (dist={config.dist.backend}): add dist=fsdp or "
                "framework.activation_checkpointing=true, or leave it empty."
            )

    def check_environment(self, config: DictConfig) -> None:
        if config.dist.backend == "horovod" and (problem := horovod_problem()):
            raise ddlkit.ConfigError(problem)
        if config.data.name == "imagefolder" and importlib.util.find_spec("PIL") is None:
            # this plugin's image pipeline decodes with Pillow: say so now, not in every rank's first batch
            from ddlkit.images import PILLOW_MISSING

            raise ddlkit.ConfigError(PILLOW_MISSING)

    def profiler(self, run: ddlkit.RunContext, out_dir: Path) -> ddlkit.Profiler:
        """``trainer.profile``: ``torch.profiler`` over the window, a trace per rank (:mod:`.profiling`)."""
        from .profiling import TorchProfiler

        cuda = (run.device or "").startswith("cuda")
        return TorchProfiler(out_dir, rank=run.dist.rank, cuda=cuda, memory=self.cfg.profile_memory)

    def _device(self, dist: ddlkit.DistContext) -> Any:
        import torch

        wanted = self.cfg.device
        if wanted == "auto":
            wanted = "cuda" if torch.cuda.is_available() else "cpu"
        if wanted.startswith("cuda") and not torch.cuda.is_available():
            raise ddlkit.ConfigError(f"framework.device={wanted} but torch sees no GPU; use framework.device=cpu")
        if wanted == "cuda" and dist.world_size > 1:
            wanted = f"cuda:{dist.local_rank}"  # one GPU per rank of the node
        device = torch.device(wanted)
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise ddlkit.ConfigError(
                f"framework.device={wanted}: torch sees {torch.cuda.device_count()} GPU(s) on this node, so rank "
                f"{dist.rank} (local rank {dist.local_rank}) has none; run one rank per GPU (e.g. "
                "compute.procs_per_node=<GPUs>) or use framework.device=cpu"
            )
        return device

    def train(self, run: ddlkit.RunContext) -> None:
        device = self._device(run.dist)
        run.phase("framework imported", say=False)  # torch, by _device
        with _cuda_settings(device, deterministic=run.cfg.trainer.deterministic):
            self._setup(run, device)
            parts = self._build(run, device)
            train_loader, val_loader = self._data(run, parts)
            self._checkpointing(run, parts)
            run.start()
            self._loop(run, parts, train_loader, val_loader)

    def _setup(self, run: ddlkit.RunContext, device: Any) -> None:
        """Process-wide settings: threads, seeds, determinism, this rank's GPU, and whether the
        precision suits the device."""
        import torch

        t = run.cfg.trainer
        if num_threads := threads.per_rank(self.cfg.num_threads, run.dist.local_size):
            torch.set_num_threads(num_threads)
        run.num_threads = torch.get_num_threads()
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        if t.deterministic:
            torch.use_deterministic_algorithms(True)
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # stray allocations (RNG state, NCCL buffers) land on this rank's GPU
        precision = str(t.precision)
        if precision == "fp16" and device.type != "cuda":
            raise cpu.fp16_refusal("pytorch", f"this rank computes on {device.type}")
        if device.type == "cpu" and run.dist.is_main and (slow := cpu.bf16_warning(precision)):
            print(f"ddlkit: warning: {slow}", file=sys.stderr, flush=True)
        if run.cfg.dist.backend == "fsdp" and device.type == "cpu" and self.cfg.fsdp_mmap_threshold_mib:
            from .sharded import return_large_frees

            return_large_frees(self.cfg.fsdp_mmap_threshold_mib)  # before the model is built

    def _build(self, run: ddlkit.RunContext, device: Any) -> _Parts:
        """The model (checked, on the device), its optimizer, loss and metrics, and the replicas."""
        import torch
        from torch import nn

        from ddlkit.custom import import_target, model_source, wrong_kind

        t = run.cfg.trainer
        model = run.build_model()
        if not isinstance(model, nn.Module):
            raise wrong_kind(model_source(run.cfg.model), model, "pytorch", "torch.nn.Module")
        if run.batch_size < 2 and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            # torch refuses it at the first BatchNorm whose input is 1x1 (the ResNets' last stage), with a traceback
            resized = f", {run.batch_size} per rank on this world size," if run.batch_size != t.batch_size else ""
            raise ddlkit.ConfigError(
                f"trainer.batch_size={t.batch_size}{resized} is too small for this model: its BatchNorm "
                "layers need at least 2 samples per rank to train. Use trainer.batch_size=2 or "
                "more."
            )
        memory_format = torch.channels_last if self.cfg.channels_last else torch.contiguous_format
        model = model.to(device, memory_format=memory_format)
        run.phase(f"model built ({sum(p.numel() for p in model.parameters()) / 1e6:.3g}M parameters)")
        replicas = Replicas(run, device)
        model = self._blocks(run, model, replicas)
        # after sharding: the optimizer steps each rank's shards (dist=fsdp)
        optimizer = run.build_optimizer(model.parameters(), **self._optimizer_kernel(run, device))
        # torch imports torch._dynamo when an optimizer is first used (~850 modules, 2.4 s on 2 shared
        # cores), in any training script: recorded apart from ddlkit's own start-up
        run.phase("optimizer built", say=False)
        precision = str(t.precision)
        custom_loss = run.cfg.model.get("loss")
        if custom_loss:
            loss_fn = import_target(custom_loss, "model.loss")
            metrics = {
                "loss": loss_fn,
                **{
                    name: import_target(path, f"model.metrics.{name}")
                    for name, path in run.cfg.model.get("metrics", {}).items()
                },
            }
        else:
            loss_fn = nn.CrossEntropyLoss(label_smoothing=run.cfg.optimizer.label_smoothing)
            # top-5 of 5 classes or fewer is always 1: not reported
            metrics = {
                "loss": loss_fn,
                "top1": _top_k(1),
                **({"top5": _top_k(5)} if run.data.info.num_classes > 5 else {}),
            }
        optimizer = replicas.wrap_optimizer(model, optimizer, accumulate=run.accumulate)
        # DDP and Horovod start every replica from rank 0's weights: the ranks wait here for the slowest
        run.phase("replicas synchronized", say=False)
        if device.type == "cuda":
            # named by its index also where torch was given just "cuda" (the current GPU), as ddlkit.result says
            run.device = f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
            run.extra_result["device_name"] = torch.cuda.get_device_name(device)
            # result.json's peak_memory_mib: this rank's peak allocated on its GPU, read once the run completed
            run.device_peak_memory_mib = lambda: torch.cuda.max_memory_allocated(device) / 2**20
        else:
            run.device = str(device)
        return _Parts(
            device=device,
            model=model,
            optimizer=optimizer,
            replicas=replicas,
            scaler=torch.amp.GradScaler(device.type, enabled=precision == "fp16"),
            autocast_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision),
            loss_fn=loss_fn,
            metrics=metrics,
            classifier=not custom_loss,
        )

    def _blocks(self, run: ddlkit.RunContext, model: Any, replicas: Replicas) -> Any:
        """The model with its blocks' activations recomputed (framework.activation_checkpointing)
        and sharded over the ranks (dist=fsdp)."""
        from . import models, sharded, swin, vit

        f = self.cfg
        if not (f.activation_checkpointing or run.cfg.dist.backend == "fsdp"):
            return model
        units = sharded.shard_units(model, f.fsdp_blocks, models.BLOCKS + vit.BLOCKS + swin.BLOCKS)
        if not units and run.dist.is_main:
            what = "activation checkpointing recomputes" if f.activation_checkpointing else "dist=fsdp shards"
            print(
                f"ddlkit: warning: {what} per block, and this model has none of the built-in block classes: "
                "the whole model is one unit. Name the classes of its blocks in framework.fsdp_blocks=[...].",
                file=sys.stderr,
                flush=True,
            )
        if f.activation_checkpointing:
            sharded.checkpoint_activations(units)
        if replicas.backend == "fsdp":
            bf16 = str(run.cfg.trainer.precision) == "bf16"
            model = replicas.shard(model, units, bf16=bf16, reshard_after_forward=f.fsdp_reshard_after_forward)
            run.phase(f"model sharded over {run.dist.world_size} ranks ({len(units)} blocks)")
        return model

    def _optimizer_kernel(self, run: ddlkit.RunContext, device: Any) -> dict[str, bool]:
        """The keyword that picks how optimizer=sgd|adamw step (framework.optimizer_kernel)."""
        kernel = str(self.cfg.optimizer_kernel)
        if run.cfg.optimizer.name not in KERNEL_OPTIMIZERS:
            return {}
        if kernel == "auto":
            return {"fused": True} if device.type == "cuda" else {}
        return {"fused": True} if kernel == "fused" else {"foreach": kernel == "foreach"}

    def _data(self, run: ddlkit.RunContext, parts: _Parts) -> tuple[Any, Any]:
        """The run's loaders as tensor loaders on the device; a classifier's output shape is
        checked on two samples first, before anything trains."""
        import torch

        from ddlkit.custom import model_source, output_mismatch

        from .data import probe_inputs, torch_loader

        info, model = run.data.info, parts.model
        adapt = dict(images=info.image_size > 0, device=parts.device, channels_last=self.cfg.channels_last)
        train, val = run.loaders()
        if parts.classifier:
            # a classifier must give (batch, classes) logits
            model.eval()
            with torch.no_grad():
                shape = tuple(model(probe_inputs(train, info, **adapt)).shape)
            model.train()
            if len(shape) != 2 or shape[1] != info.num_classes:
                raise output_mismatch(model_source(run.cfg.model), shape, info.num_classes)
            run.phase("output checked", say=False)  # the model's first forward pass
        train_loader = torch_loader(train, **adapt)
        val_loader = torch_loader(val, **adapt) if val is not None else None
        run.phase("data ready")
        return train_loader, val_loader

    @staticmethod
    def _checkpointing(run: ddlkit.RunContext, parts: _Parts) -> None:
        """How a checkpoint holds the model, the optimizer, the loss scaler and the RNGs; loads
        the one the run resumes from."""
        import torch

        from .staging import HostStaging

        device, model, optimizer, scaler = parts.device, parts.model, parts.optimizer, parts.scaler
        if run.cfg.dist.backend == "fsdp":
            # sharded at any world size, so that 2 ranks resume on 1 and back
            from .sharded import ShardedCheckpoints

            shards = ShardedCheckpoints(
                model, optimizer, scaler, device=device, rank=run.dist.rank, group=parts.replicas.checkpoint_group
            )
            run.checkpointing(shards.save, shards.load, shards.snapshot, sharded=True)
            return

        def state(meta: dict[str, Any]) -> dict[str, Any]:
            return {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": random_state(device),
                "meta": meta,
            }

        def write(path: Path, checkpoint: dict[str, Any]) -> None:
            # into a file object, not a path: torch then hands each tensor's bytes to Python's
            # write, which lets go of the GIL; given a path, its C++ writer holds the GIL for the
            # whole copy, and a training thread beside a write in the background stops (ResNet-18:
            # its steps took twice as long meanwhile)
            with open(path, "wb") as f:
                torch.save(checkpoint, f)

        def save(path: Path, meta: dict[str, Any]) -> None:
            write(path, state(meta))

        staging = HostStaging()

        def snapshot(meta: dict[str, Any]) -> Callable[[Path], None]:
            copy = staging.copy(state(meta))
            return lambda path: write(path, copy)

        def load(path: Path) -> dict[str, Any]:
            # weights_only: a checkpoint is data, never code to run
            ckpt = torch.load(path, map_location=device, weights_only=True)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            set_random_state(ckpt["rng"], device)
            return ckpt["meta"]

        run.checkpointing(save, load, snapshot)

    def _loop(self, run: ddlkit.RunContext, parts: _Parts, train_loader: Any, val_loader: Any) -> None:
        """Train from where the checkpoint left off to the end, then save the model."""
        import torch

        from .models import AutocastForward

        t, device, model, optimizer = run.cfg.trainer, parts.device, parts.model, parts.optimizer
        scaler, replicas, loss_fn, metrics = parts.scaler, parts.replicas, parts.loss_fn, parts.metrics
        # after the checkpoint is loaded: the replicas start from rank 0's weights (and all ranks
        # loaded the same checkpoint, or Horovod broadcast rank 0's optimizer state)
        forward_model = model
        if self.cfg.compile and parts.autocast_dtype is not None:
            # the autocast inside the compiled graph: see AutocastForward (a torch caching bug)
            forward_model = AutocastForward(model, device.type, parts.autocast_dtype)
        step_model = replicas.wrap_model(forward_model, optimizer)
        if self.cfg.compile:
            step_model = torch.compile(step_model)

        def evaluate() -> dict[str, float]:
            model.eval()
            total, sums = 0, dict.fromkeys(metrics, 0.0)
            with torch.no_grad(), parts.autocast():
                for inputs, targets in val_loader.iter_epoch(0):
                    out = step_model(inputs.to(device, non_blocking=True)).float()
                    targets = targets.to(device, non_blocking=True)
                    n = targets.shape[0]
                    for name, fn in metrics.items():  # each a batch mean: weighted by the batch's size
                        sums[name] += float(fn(out, targets)) * n
                    total += n
            model.train()
            return {f"val_{name}": value / total for name, value in sums.items()}

        parameters = list(model.parameters())
        unsettled = replicas.buckets_unsettled(run)

        def step(micro_batches: list[Any], lr: float) -> Any:
            nonlocal unsettled
            for group in optimizer.param_groups:
                group["lr"] = lr
            if unsettled:
                images, labels = micro_batches[-1]

                def settling_loss() -> Any:
                    with parts.autocast():
                        return scaler.scale(
                            loss_fn(
                                step_model(images.to(device, non_blocking=True)), labels.to(device, non_blocking=True)
                            )
                        )

                replicas.settle_buckets(model, settling_loss)
                unsettled = False
            optimizer.zero_grad()  # set_to_none by default (and Horovod's takes no argument)
            n = len(micro_batches)
            total = None
            for i, (images, labels) in enumerate(micro_batches):
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                # the gradients of the micro-batches' mean losses add up to the mean over them all;
                # DDP all-reduces only in the last one's backward pass
                with replicas.accumulating(step_model, last=i == n - 1):
                    with parts.autocast():
                        loss = loss_fn(step_model(images), labels)
                    scaler.scale(loss / n if n > 1 else loss).backward()
                total = loss.detach() if total is None else total + loss.detach()
            # the wait for the others, so that a straggler is told from the ranks that wait for it
            run.telemetry.add_sync(replicas.waited())
            replicas.step(optimizer, scaler, clip_grad_norm=t.clip_grad_norm, parameters=parameters)
            scaler.update()
            mean = total / n if n > 1 else total
            return mean.item  # read on logging steps only (a device sync on GPUs)

        model.train()
        run.train_epochs(run.step_batches(train_loader.iter_epoch), step, evaluate if val_loader is not None else None)
        if scaler.is_enabled():
            run.extra_result["loss_scale"] = scaler.get_scale()
        run.extra_result["model_state_mib"] = round(_state_bytes(parameters, optimizer) / 2**20, 1)
        if decoder := getattr(train_loader, "decoder", None):  # data=imagefolder: which decoder ran, and how often
            run.extra_result.update(decoder=decoder, **train_loader.decoded_counts)
        if t.save_model:
            # a plain state dict, whatever the dist: gathered from the shards (every rank takes part)
            weights = replicas.full_state_dict(model)
            run.save_artifact("model.pt", lambda p: torch.save(weights, p))
        replicas.close()
        self.model = model


@dataclass
class _Parts:
    """What :meth:`PytorchFramework._build` makes and the later phases share."""

    device: Any
    #: the plain module (without DDP/compile wrappers): its state_dict keys are the checkpoint's
    model: Any
    optimizer: Any
    scaler: Any
    replicas: Replicas
    #: torch.bfloat16 or torch.float16 under mixed precision, else None
    autocast_dtype: Any
    loss_fn: Any
    #: name -> fn(outputs, targets), the loss among them: validation's batch means
    metrics: dict[str, Any]
    #: the built-in cross-entropy task (no model.loss): the output shape can be checked
    classifier: bool

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def _state_bytes(parameters: list[Any], optimizer: Any) -> int:
    """What rank 0 holds of the model's state: its parameters, their gradients and the optimizer's
    state (this rank's shards under dist=fsdp), in bytes."""

    def nbytes(t: Any) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    tensors = [*parameters, *(p.grad for p in parameters if p.grad is not None)]
    tensors += [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "numel")]
    return sum(nbytes(t) for t in tensors)


def _top_k(k: int) -> Any:
    """The share of a batch whose label is among the ``k`` highest logits."""

    def top_k(logits: Any, labels: Any) -> Any:
        best = logits.topk(min(k, logits.shape[1]), dim=1).indices
        return best.eq(labels.unsqueeze(1)).any(dim=1).float().mean()

    return top_k


#: cuBLAS's setting under which its matrix products are deterministic (see torch's reproducibility notes)
CUBLAS_DETERMINISTIC = ":4096:8"


@contextlib.contextmanager
def _cuda_settings(device: Any, *, deterministic: bool) -> Iterator[None]:
    """What a CUDA run needs from process-wide settings, restored afterwards (in-process runs and
    tests share the process):

    * ``cudnn.benchmark``: cuDNN times its convolution algorithms once per input shape and keeps
      the fastest, unless the run must be deterministic (the choice could differ between runs);
    * deterministic runs: cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` before its first product, or
      ``torch.use_deterministic_algorithms`` refuses every matrix product on the GPU. Set for the
      run when the user has not set it (torch reads it once per process, at the first product).
    """
    if device.type != "cuda":
        yield
        return
    import torch

    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not deterministic
    set_env = deterministic and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    if set_env:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC
    try:
        yield
    except RuntimeError as err:
        if deterministic and "CUBLAS_WORKSPACE_CONFIG" in str(err):
            raise ddlkit.ConfigError(
                "trainer.deterministic=true on a GPU: this process ran a cuBLAS product before the run started, "
                f"so cuBLAS is not deterministic here; set CUBLAS_WORKSPACE_CONFIG={CUBLAS_DETERMINISTIC} before "
                "the process starts"
            ) from err
        raise
    finally:
        torch.backends.cudnn.benchmark = benchmark
        if set_env:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


class Replicas:
    """How the ranks' model replicas stay identical, per ``dist.backend`` (a job of one rank
    trains alone whatever the backend says):

    * ``none``: one process, nothing to share;
    * ``native``: ``torch.distributed`` (gloo on the CPU, nccl on GPUs) with the rendezvous the
      launcher put in the environment (``MASTER_ADDR``/``MASTER_PORT``: local_mpi, torchrun), and
      ``DistributedDataParallel``, which averages gradients during the backward pass and
      broadcasts rank 0's parameters (and BatchNorm buffers, at each forward) to the others;
    * ``horovod``: ``hvd.DistributedOptimizer`` averages gradients; rank 0's parameters (and,
      after a resume, its optimizer state) are broadcast before the first step. BatchNorm running
      statistics stay per rank (rank 0's are the ones checkpointed), as in Horovod's own examples;
    * ``fsdp``: ``torch.distributed`` as for native, the model sharded (:mod:`.sharded`): there
      are no replicas, each rank holds its shards, gathered block by block as they are needed.
    """

    def __init__(self, run: ddlkit.RunContext, device: Any) -> None:
        self.backend = run.cfg.dist.backend if run.dist.world_size > 1 else "none"
        self.device = device
        f = run.cfg.framework
        #: DistributedDataParallel's settings (framework.ddp_*)
        self.ddp = {
            "bucket_cap_mb": f.ddp_bucket_cap_mb,
            "gradient_as_bucket_view": f.ddp_gradient_as_bucket_view,
            "static_graph": f.ddp_static_graph,
        }
        self.hvd: Any = None
        #: dist=native on the CPU: when this rank's last gradient bucket of the step was ready (perf_counter)
        self.last_bucket_ready: float | None = None
        #: dist=fsdp: the sharded model, and the process group its checkpoints are written over
        self.root: Any = None
        self.checkpoint_group: Any = None
        self.world_size = run.dist.world_size
        if self.backend in ("native", "fsdp"):
            from datetime import timedelta

            timeout = timedelta(seconds=run.cfg.dist.timeout_s)
            init_process_group(device, rank=run.dist.rank, world_size=run.dist.world_size, timeout=timeout)
            if self.backend == "fsdp":
                import torch.distributed as tdist

                # a group of its own: a checkpoint written in the background runs its collectives on
                # a thread while training runs its own, which must not share a group
                self.checkpoint_group = tdist.new_group(backend="gloo", timeout=timeout)
        elif self.backend == "horovod":
            import horovod.torch as hvd

            hvd.init()
            if hvd.size() != run.dist.world_size:
                raise ddlkit.RunError(
                    f"Horovod sees {hvd.size()} ranks but the job has {run.dist.world_size}: "
                    "Horovod was started outside the job's launcher?",
                    component="framework",
                )
            self.hvd = hvd

    def wrap_optimizer(self, model: Any, optimizer: Any, *, accumulate: int = 1) -> Any:
        """Before the checkpoint is loaded: Horovod's optimizer is a new object, whose state
        the checkpoint must fill. It all-reduces once per ``accumulate`` backward passes."""
        if self.hvd is None:
            return optimizer
        return self.hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=accumulate
        )

    def shard(self, model: Any, units: list[Any], *, bf16: bool, reshard_after_forward: bool) -> Any:
        """dist=fsdp: ``model`` sharded over the ranks, in place (before its optimizer is built)."""
        from .sharded import shard

        self.root = shard(
            model,
            units,
            world_size=self.world_size,
            device=self.device,
            bf16=bf16,
            reshard_after_forward=reshard_after_forward,
        )
        return self.root

    def full_state_dict(self, model: Any) -> dict[str, Any]:
        """The plain state dict of the trained model: gathered from the shards with dist=fsdp
        (on every rank; rank 0 holds it), the replica's own otherwise."""
        if self.root is None:
            return model.state_dict()
        from .sharded import full_state_dict

        return full_state_dict(self.root)

    def wrap_model(self, model: Any, optimizer: Any) -> Any:
        """The module to train with; ``model`` itself stays the plain one (state_dict keys)."""
        if self.backend == "native":
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            ddp = DistributedDataParallel(
                model,
                device_ids=device_ids,
                bucket_cap_mb=self.ddp["bucket_cap_mb"],
                gradient_as_bucket_view=self.ddp["gradient_as_bucket_view"],
                static_graph=self.ddp["static_graph"],
            )
            if self.device.type == "cpu":
                ddp.register_comm_hook(self, _timed_allreduce)
            return ddp
        if self.hvd is not None:
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            # only a resumed optimizer has state to share (every rank loaded the same checkpoint,
            # so all take this branch or none). Horovod fills an empty state by stepping with zero
            # gradients, which with weight decay moves the weights and seeds the momentum buffers:
            # a fresh run would silently take a decay step the 1-rank run never takes
            if optimizer.state_dict()["state"]:
                self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model

    def buckets_unsettled(self, run: ddlkit.RunContext) -> bool:
        """Whether the first step of this run needs :meth:`settle_buckets`: a resumed DDP job of
        more than 2 ranks (2 ranks' sums are the same in any order)."""
        return self.backend == "native" and run.resumed_at is not None and run.dist.world_size > 2

    def settle_buckets(self, model: Any, loss: Callable[[], Any]) -> None:
        """One forward and backward pass whose gradients are thrown away, so that the resumed run's
        first step all-reduces in the buckets every later step uses -- as the run that never
        stopped did at that step. DDP lays gradients into buckets in parameter order at first and
        in the order the first backward pass made them ready from the second step on; a bucket's
        layout decides which rank's ring segment holds a gradient, hence the order its sum is
        taken in over 3 or more ranks (2.4e-8 off after 4 ranks resumed; bitwise with this).
        BatchNorm's statistics and the random state are as they were before the pass."""
        import torch

        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        loss().backward()  # the step's optimizer.zero_grad() drops the gradients
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, self.device)

    def waited(self) -> float:
        """Seconds this rank waited for the others in the step's gradient all-reduce (DDP on the
        CPU, whose backward pass returns once every bucket is summed): from its last bucket ready
        to now, the end of the backward pass; 0 where that cannot be seen (GPUs, other backends)."""
        ready, self.last_bucket_ready = self.last_bucket_ready, None
        return time.perf_counter() - ready if ready is not None else 0.0

    def accumulating(self, model: Any, *, last: bool) -> contextlib.AbstractContextManager:
        """Around a micro-batch's forward and backward pass: DDP's ``no_sync`` unless it is the
        step's last, so the ranks all-reduce once per optimizer step (Horovod counts the passes
        itself: ``backward_passes_per_step``; FSDP keeps the micro-batches' gradients unsharded
        and reduce-scatters them in the last one's backward pass)."""
        if self.root is not None:
            self.root.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if last or self.backend != "native":
            return contextlib.nullcontext()
        return model.no_sync()

    def step(
        self, optimizer: Any, scaler: Any, *, clip_grad_norm: float | None = None, parameters: list[Any] | None = None
    ) -> None:
        """The optimizer step, the gradients clipped to ``clip_grad_norm`` (their global L2 norm)
        first: after the all-reduce (DDP's ran in the backward pass, Horovod's is forced here) and
        after fp16's unscaling. An fp16 overflow makes the norm inf and the gradients NaN, which the
        scaler sees (it recorded the overflow when unscaling) and skips the step."""
        import torch

        if self.hvd is not None and (scaler.is_enabled() or clip_grad_norm):
            # Horovod: unscale and clip only after the all-reduce, then step without a second one
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            if clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad_norm)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            return
        if clip_grad_norm:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad_norm)
        scaler.step(optimizer)

    def close(self) -> None:
        if self.backend in ("native", "fsdp"):
            import torch.distributed as tdist

            tdist.destroy_process_group()
        elif self.hvd is not None:
            self.hvd.shutdown()


def _timed_allreduce(replicas, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations against its own
    """DDP's own all-reduce (torch's ``allreduce_hook``: the same sums as without a hook), noting
    when this rank's bucket was ready: the last one's time, to the end of the backward pass, is
    how long this rank waited for the slowest (:meth:`Replicas.waited`)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    replicas.last_bucket_ready = time.perf_counter()
    return allreduce_hook(None, bucket)


def init_process_group(device: Any, *, rank: int, world_size: int, timeout: Any) -> None:
    """torch.distributed for ``dist=native``: NCCL bound to this rank's GPU, or gloo on the CPU
    (rendezvous from ``MASTER_ADDR``/``MASTER_PORT``)."""
    import torch
    import torch.distributed as tdist

    if device.type == "cuda":
        # NCCL needs the device's index (device_id binds the communicator to it eagerly)
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        tdist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timeout, device_id=device)
    else:
        tdist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)


def random_state(device: Any) -> dict[str, Any]:
    """The random state a checkpoint keeps: torch's, Python's, and the GPU's on CUDA."""
    import torch

    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def set_random_state(rng: dict[str, Any], device: Any) -> None:
    """Take up the :func:`random_state` a checkpoint kept."""
    import torch

    torch.set_rng_state(rng["torch"].cpu())
    # torch.load gives lists back where random.getstate() had tuples
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)
