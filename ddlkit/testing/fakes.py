"""Fake components for tests: a plugin module, like any other, registering

* ``framework=fake`` (:class:`FakeFramework`): a real, tiny training loop in numpy, with its
  model (``model=softmax``, and the ResNets' names as aliases of it, so that the default config
  composes) and its one optimizer (``optimizer=sgd``);
* ``storage=memory`` (:class:`MemoryStorage`): objects in an in-process dict;
* ``logger=recording`` (:class:`RecordingLogger`): keeps every call in memory;
* ``compute=elsewhere`` (:class:`~ddlkit.testing.elsewhere.ElsewhereTarget`): runs the job on a
  copy of its directory, in a bare environment, as a remote cluster would.

Enable it in a subprocess with ``DDLKIT_PLUGINS=ddlkit.testing.fakes`` (what ``run_factory``
does) or register it on a manager with :func:`ddlkit.testing.add_plugin`. The fakes import
neither torch nor TensorFlow, so tests of the core and of non-framework plugins stay fast.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ..atomic import atomic_path
from ..config import BACKENDS
from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import ComputeTarget, Framework, Logger, StorageBackend
from ..jobdir import NODE_DOWN, RESTARTS_ENV
from ..registry import Registration

if TYPE_CHECKING:
    import numpy as np
    from omegaconf import DictConfig

    from ..interfaces import RunContext

#: file name of the trained weights FakeFramework writes into the job directory
MODEL_FILE = "model.npy"


# ---------------------------------------------------------------------------- framework=fake
@dataclass
class FakeFrameworkConfig:
    # images are subsampled to side x side pixels before flattening, so that a step stays
    # cheap at any data.image_size
    side: int = 4
    # raise RuntimeError at this global step (0 = never): drives the failure paths in tests
    fail_at_step: int = 0
    # only this rank raises at fail_at_step (null: every rank); the others go on until they are stopped
    fail_rank: int | None = None
    # rank kill_rank kills itself with SIGKILL at this global step (0 = never), in a job's first run
    # only (every run with kill_every_run): a lost rank or node, for the restart policy's tests
    kill_at_step: int = 0
    kill_rank: int = 0
    kill_every_run: bool = False
    # instead of kill_rank: every rank of this node marks it down (a file `down` in its scratch
    # directory, as compute=local_mpi reads it) and kills itself: a node lost that does not come back
    kill_node: int | None = None
    # average the gradient over the ranks before each update, as a real framework does: the weights
    # then depend on the global batch only, not on how many ranks shared it
    allreduce: bool = False
    # write the sample numbers each rank trained on at each step (data=custom with
    # ddlkit.testing.fakes:class_images and +data.kwargs.numbered=true) to trace/rank-N.jsonl
    trace_samples: bool = False
    # where trace_samples writes (null: the job directory's trace/): a directory every rank reaches, for
    # targets whose ranks write into copies of the job directory on their nodes, which a lost node takes along
    trace_dir: str | None = None
    # rank 0 kills itself with SIGKILL halfway through writing the checkpoint of this step (0 = never),
    # in a job's first run only: a checkpoint half written when its node was lost
    kill_while_saving_at_step: int = 0
    # the loss of this global step is NaN (0 = never): a run that diverged
    nan_at_step: int = 0
    # seconds each step sleeps: a job that lasts, to attach to, cancel or interrupt in tests
    step_delay_s: float = 0.0
    # seconds each checkpoint write sleeps before it writes: a slow disk (a write still in the
    # background when the next steps run, or when the run ends)
    save_delay_s: float = 0.0
    # modules the ranks' environment must have (as Horovod for dist=horovod): check_environment's path in tests
    needs: list[str] = field(default_factory=list)
    # MiB of memory each rank allocates, writes and holds while it trains (0 = none): a rank that needs more
    # memory than the others, for result.json's peak_memory_mib
    hold_mib: int = 0
    # only this rank holds hold_mib (null: every rank)
    hold_rank: int | None = None


class FakeFramework(Framework):
    """Softmax regression trained with momentum SGD on the data source's numpy batches as they
    are (no adapter: the neutral batches are what it computes with).

    It drives :class:`ddlkit.Run` exactly as a real framework plugin does (schedule, step_end,
    validation_end, epoch_end, loaders, checkpointing, start, save_artifact), deterministically and in float64, so
    an interrupted and resumed run ends with weights identical to an uninterrupted one.

    With ``dist=fsdp`` its checkpoints are sharded as a sharded framework's are: each rank writes
    its rows of the weights into the checkpoint's directory and waits until every rank's part is
    there (a file barrier: the collective), rank 0 adds the rest; loading reassembles the rows
    from however many parts there are (another world size reshards).
    """

    backends = BACKENDS

    def configure(self, config: DictConfig) -> None:
        if self.cfg.side < 1:
            raise ConfigError(f"framework.side={self.cfg.side} is invalid: it must be a positive integer.")
        if self.cfg.hold_mib < 0:
            raise ConfigError(f"framework.hold_mib={self.cfg.hold_mib} is invalid: it must be 0 or more.")

    def check_environment(self, config: DictConfig) -> None:
        import importlib.util

        missing = [m for m in self.cfg.needs if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(
                f"framework=fake needs {', '.join(missing)}, which this environment lacks: "
                "install it where the ranks run."
            )

    def train(self, run: RunContext) -> None:
        import numpy as np

        t, o = run.cfg.trainer, run.cfg.optimizer
        run.device = "cpu"  # numpy
        holds = self.cfg.hold_mib and self.cfg.hold_rank in (None, run.dist.rank)
        # float64s, every page written, so that the rank's resident set holds them
        held = np.ones(self.cfg.hold_mib << 17) if holds else None
        info = run.data.info
        side = min(self.cfg.side, info.image_size)
        # parameters and momentum buffer in one dict, so save/load cannot forget one of them
        params = run.build_model(side=side, seed=t.seed)
        run.build_optimizer()

        def write(path: Path, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
            with open(path, "wb") as f:
                if self.cfg.kill_while_saving_at_step == meta["state"]["step"] and not os.environ.get(RESTARTS_ENV):
                    whole = io.BytesIO()
                    np.savez(whole, **arrays, meta=np.array(json.dumps(meta)))
                    f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.cfg.save_delay_s:
                    time.sleep(self.cfg.save_delay_s)
                np.savez(f, **arrays, meta=np.array(json.dumps(meta)))

        def save(path: Path, meta: dict[str, Any]) -> None:
            write(path, params, meta)

        def snapshot(meta: dict[str, Any]) -> Callable[[Path], None]:
            # the arrays as they are at this step: the steps that follow replace them while the copy is written
            arrays = _copy(params)
            return lambda path: write(path, arrays, meta)

        def load(path: Path) -> dict[str, Any]:
            with np.load(path, allow_pickle=False) as ckpt:
                for key in params:
                    params[key] = ckpt[key].copy()
                return json.loads(str(ckpt["meta"]))

        train_loader, val_loader = run.loaders()
        sharded = run.cfg.dist.backend == "fsdp"
        if sharded:
            shards = _Shards(run.dist.rank, run.dist.world_size, run.cfg.dist.timeout_s, self.cfg.save_delay_s)

            def save(path: Path, meta: dict[str, Any]) -> None:
                shards.write(path, params, meta)

            def snapshot(meta: dict[str, Any]) -> Callable[[Path], None]:
                arrays = _copy(params)  # as they are at this step
                return lambda path: shards.write(path, arrays, meta)

            def load(path: Path) -> dict[str, Any]:
                return shards.read(path, params)

        run.checkpointing(save, load, snapshot, sharded=sharded)
        run.start()

        def evaluate() -> dict[str, float]:
            assert val_loader is not None  # train_epochs is given evaluate only with a validation loader
            total = loss_sum = top1 = top5 = 0.0
            for images, labels in val_loader.iter_epoch(0):
                probs = _softmax(_matmul(_inputs(images, side), params["theta"]))
                labels = np.asarray(labels)
                loss_sum += -np.log(probs[np.arange(len(labels)), labels] + 1e-12).sum()
                best = np.argsort(-probs, axis=1)[:, :5]
                top1 += (best[:, 0] == labels).sum()
                top5 += (best == labels[:, None]).any(axis=1).sum()
                total += len(labels)
            return {"val_loss": loss_sum / total, "val_top1": top1 / total, "val_top5": top5 / total}

        def step(micro_batches: list[Any], lr: float) -> float:
            if (
                self.cfg.fail_at_step
                and run.state.step + 1 == self.cfg.fail_at_step
                and self.cfg.fail_rank in (None, run.dist.rank)
            ):
                raise RuntimeError(f"fake framework failure at step {run.state.step + 1}")
            if (
                self.cfg.kill_at_step
                and run.state.step + 1 == self.cfg.kill_at_step
                and (self.cfg.kill_every_run or not os.environ.get(RESTARTS_ENV))
            ):
                if self.cfg.kill_node is None and run.dist.rank == self.cfg.kill_rank:
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.cfg.kill_node is not None and run.dist.node == self.cfg.kill_node:
                    # each rank of the node marks it first: whichever dies first, the mark is there
                    Path(run.dist.node_scratch or ".", NODE_DOWN).touch()
                    os.kill(os.getpid(), signal.SIGKILL)
            if self.cfg.step_delay_s:
                time.sleep(self.cfg.step_delay_s)
            # the mean loss of equal micro-batches is the mean over their union: one batch of all
            images = np.concatenate([np.asarray(b[0]) for b in micro_batches])
            labels = np.concatenate([np.asarray(b[1]) for b in micro_batches])
            if self.cfg.trace_samples:
                _trace(
                    run,
                    [int(round(float(v))) for v in images[:, NUMBER_PIXEL[0], NUMBER_PIXEL[1], 0]],
                    self.cfg.trace_dir,
                )
            reduce = _mean_over(run.dist) if self.cfg.allreduce and run.dist.world_size > 1 else None
            loss = _sgd_step(params, _inputs(images, side), labels, lr, o, t.clip_grad_norm, reduce)
            return float("nan") if self.cfg.nan_at_step == run.state.step + 1 else loss

        run.train_epochs(run.step_batches(train_loader.iter_epoch), step, evaluate if val_loader is not None else None)
        del held  # held until training ended
        if t.save_model:
            # .npy rather than .npz: no zip timestamps, so equal weights give equal bytes
            run.save_artifact(MODEL_FILE, lambda p: _save_npy(p, params["theta"]))


def _inputs(images: np.ndarray, side: int) -> np.ndarray:
    """NHWC images -> every k-th pixel of a side x side grid, flattened, plus a constant 1."""
    import numpy as np

    x = np.asarray(images)
    k = x.shape[1] // side
    x = x[:, ::k, ::k, :][:, :side, :side, :].reshape(len(x), -1).astype(np.float64)
    return np.concatenate([x, np.ones((len(x), 1))], axis=1)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` without BLAS: a threaded BLAS spends longer starting its threads than these
    tiny products take (15 ms instead of 0.5 ms on a busy 2-core machine)."""
    import numpy as np

    return np.einsum("ij,jk->ik", a, b)


def _softmax(logits: np.ndarray) -> np.ndarray:
    import numpy as np

    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


#: where class_images(numbered=True) writes a sample's number: a pixel the fake framework's model does
#: not read at its default framework.side=4 on 8-pixel images (it reads every other pixel from 0)
NUMBER_PIXEL = (1, 1)
#: the directory of framework.trace_samples' files, in the job directory
TRACE_DIR = "trace"


def _trace(run: RunContext, numbers: list[int], trace_dir: str | None = None) -> None:
    """One line per step: the run (restarts before it), the epoch, the step, the samples read."""
    line = json.dumps(
        {
            "run": int(os.environ.get(RESTARTS_ENV) or 0),
            "epoch": run.state.epoch,
            "step": run.state.step + 1,
            "samples": numbers,
        }
    )
    path = Path(trace_dir or run.job_dir / TRACE_DIR) / f"rank-{run.dist.rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def _mean_over(dist: Any) -> Any:
    """The gradient averaged over the ranks (each rank's is the mean over its equal share)."""
    import numpy as np

    def reduce(grad: np.ndarray) -> np.ndarray:
        return np.asarray(dist.allreduce(grad.ravel().tolist(), "mean")).reshape(grad.shape)

    return reduce


def _sgd_step(
    params: dict[str, np.ndarray],
    x: np.ndarray,
    labels: np.ndarray,
    lr: float,
    o: Any,
    clip: float | None = None,
    reduce: Any = None,
) -> float:
    """One step of cross-entropy + SGD with momentum and weight decay (torch.optim.SGD's rule), the
    gradient averaged over the ranks by ``reduce`` and clipped to norm ``clip`` first (as
    torch.nn.utils.clip_grad_norm_ does)."""
    import numpy as np

    theta = params["theta"]
    probs = _softmax(_matmul(x, theta))
    classes = theta.shape[1]
    target = np.full_like(probs, o.label_smoothing / classes)
    target[np.arange(len(labels)), labels] += 1.0 - o.label_smoothing
    loss = float(-(target * np.log(probs + 1e-12)).sum(axis=1).mean())
    grad = _matmul(x.T, probs - target) / len(labels)
    if reduce is not None:
        grad = reduce(grad)
    if clip:
        grad = grad * min(1.0, clip / (float(np.linalg.norm(grad)) + 1e-6))
    grad = grad + o.weight_decay * theta
    velocity = o.momentum * params["velocity"] + grad
    params["velocity"] = velocity
    params["theta"] = theta - lr * (grad + o.momentum * velocity if o.nesterov else velocity)
    return loss


def _save_npy(path: Path, array: np.ndarray) -> None:
    import numpy as np

    with open(path, "wb") as f:
        np.save(f, array)


def _copy(arrays: dict[str, Any]) -> dict[str, Any]:
    return {key: value.copy() for key, value in arrays.items()}


@dataclass
class _Shards:
    """The fake framework's sharded checkpoints (dist=fsdp): rank r of n keeps rows r, r+n, ...
    of each array in ``part-r.npz``; rank 0 also writes ``meta.json``."""

    rank: int
    world_size: int
    timeout_s: float
    #: framework.save_delay_s: a slow disk
    delay_s: float = 0.0

    def write(self, path: Path, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
        import numpy as np

        path.mkdir(parents=True, exist_ok=True)
        if self.delay_s:
            time.sleep(self.delay_s)
        rows = {key: value[self.rank :: self.world_size] for key, value in arrays.items()}
        with atomic_path(path / f"part-{self.rank}.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, **rows)
        if self.rank == 0:
            with atomic_path(path / "meta.json") as tmp:
                tmp.write_text(json.dumps({**meta, "parts": self.world_size}))
        # the collective: every rank returns once all parts are there, rank 0 last (it completes
        # the checkpoint, which moves the directory the others look into)
        self._wait_for(path, "part-{}.npz")
        (path / f"seen-{self.rank}").touch()
        if self.rank == 0:
            self._wait_for(path, "seen-{}")

    def _wait_for(self, path: Path, name: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not all((path / name.format(r)).exists() for r in range(self.world_size)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every rank wrote {name.format('N')} in {path} within {self.timeout_s:g} s")
            time.sleep(0.05)

    @staticmethod
    def read(path: Path, arrays: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        meta = json.loads((path / "meta.json").read_text())
        parts = meta.pop("parts")
        for key, value in arrays.items():
            full = np.empty_like(value)
            for r in range(parts):
                with np.load(path / f"part-{r}.npz", allow_pickle=False) as part:
                    full[r::parts] = part[key]
            arrays[key] = full
        return meta


# ---------------------------------------------------------------------------- storage=memory
@dataclass
class MemoryStorageConfig:
    # a credential the fake ignores; it lets tests check that secrets stay out of job files
    sas_token: str = ""
    # a URL the fake ignores (one with a SAS in its query string must stay out of job files too)
    account_url: str = ""
    # when set: the storage refuses to start (on the ranks) unless this is the sha256 of
    # "<sas_token>|<account_url>", so that tests see the ranks got the real values back
    expect_sha256: str = ""


class MemoryStorage(StorageBackend):
    """A storage backend in a dict: for tests of code that stores and fetches objects."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.objects: dict[str, bytes] = {}
        expected = getattr(cfg, "expect_sha256", "") if cfg is not None else ""
        if expected:
            import hashlib

            got = hashlib.sha256(f"{cfg.sas_token}|{cfg.account_url}".encode()).hexdigest()
            if got != expected:
                raise ConfigError(
                    "storage=memory: sha256 of sas_token|account_url is not storage.expect_sha256 "
                    "(the ranks did not get the secrets back)"
                )

    @staticmethod
    def _key(key: str) -> str:
        parts = PurePosixPath(key).parts
        if not key or key.startswith("/") or ".." in parts:
            raise ValueError(f"key {key!r} escapes the storage root")
        return key

    def put(self, local_path: Path, key: str) -> None:
        # read first: a failing read leaves the previous object in place (atomic replacement)
        self.objects[self._key(key)] = Path(local_path).read_bytes()

    def get(self, key: str, local_path: Path) -> None:
        try:
            data = self.objects[self._key(key)]
        except KeyError:
            raise FileNotFoundError(f"no object {key!r} in storage=memory") from None
        with atomic_path(Path(local_path)) as tmp:
            tmp.write_bytes(data)

    def exists(self, key: str) -> bool:
        return self._key(key) in self.objects

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


# ---------------------------------------------------------------------------- logger=recording
@dataclass(frozen=True)
class LoggedCall:
    #: "start", "log_metrics" or "finish"
    method: str
    step: int | None = None
    split: str | None = None
    metrics: Mapping[str, float] | None = None
    status: str | None = None
    result: Mapping[str, Any] | None = None


class RecordingLogger(Logger):
    """Keeps every call in :attr:`calls`, in order; reach it in-process through ``run.loggers``."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.calls: list[LoggedCall] = []

    def start(self, run: RunContext) -> None:
        self.calls.append(LoggedCall("start", step=run.state.step))

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        self.calls.append(LoggedCall("log_metrics", step=step, split=split, metrics=dict(metrics)))

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        self.calls.append(LoggedCall("finish", status=status, result=dict(result) if result is not None else None))

    def steps(self, split: str = "train") -> list[int]:
        return [c.step for c in self.calls if c.method == "log_metrics" and c.split == split and c.step is not None]


def class_images(
    split: str,
    n: int = 256,
    val_n: int = 32,
    image_size: int = 8,
    num_classes: int = 4,
    seed: int = 0,
    numbered: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Data for ``data=custom data.target=ddlkit.testing.fakes:class_images``: ``n`` (``val_n``)
    images of noise around a class pattern, each a sample of one dataset that the ranks
    share by :func:`ddlkit.images.epoch_order`, as a real dataset is (``data=synthetic`` draws a
    stream per rank instead, which changes with the world size). ``numbered``: each image carries its
    number in :data:`NUMBER_PIXEL`, for ``framework.trace_samples``."""
    import numpy as np

    count = n if split == "train" else val_n
    rng = np.random.default_rng([seed, split == "val"])
    labels = rng.integers(0, num_classes, count)
    patterns = np.random.default_rng(seed).normal(0.0, 1.0, (num_classes, image_size, image_size, 3))
    images = patterns[labels] + rng.normal(0.0, 1.0, (count, image_size, image_size, 3))
    if numbered:  # each sample's number, where the model does not look (framework.trace_samples)
        images[:, NUMBER_PIXEL[0], NUMBER_PIXEL[1], 0] = np.arange(count)
    return images.astype(np.float32), labels


def build_softmax(cfg: Any, data: Any, *, side: int, seed: int) -> dict[str, np.ndarray]:
    """``model=softmax`` for ``framework=fake``: its weights and momentum buffer."""
    import numpy as np

    features = 3 * side * side + 1  # + 1: a constant input that serves as the bias
    return {
        "theta": np.random.default_rng(seed).normal(0.0, 0.01, (features, data.num_classes)),
        "velocity": np.zeros((features, data.num_classes)),
    }


def build_sgd(cfg: Any) -> None:
    """``optimizer=sgd`` for ``framework=fake``: the update is :func:`_sgd_step`, which reads ``cfg``."""


# ---------------------------------------------------------------------------- registration
@hookimpl
def ddlkit_frameworks() -> Iterator[Registration[Framework]]:
    yield Registration(
        "fake", FakeFramework, config=FakeFrameworkConfig, description="softmax regression in numpy, for tests"
    )


@hookimpl
def ddlkit_models() -> Iterator[Registration[Any]]:
    yield Registration("softmax", build_softmax, framework="fake", description="softmax regression (numpy)")
    # aliases, so that the default config (model=resnet18) composes with framework=fake
    for name in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152"):
        yield Registration(name, build_softmax, framework="fake", description="softmax regression (numpy)")


@hookimpl
def ddlkit_optimizers() -> Iterator[Registration[Any]]:
    from ..optim import SGDConfig

    yield Registration("sgd", build_sgd, config=SGDConfig, framework="fake", description="SGD with momentum (numpy)")


@hookimpl
def ddlkit_storage_backends() -> Iterator[Registration[StorageBackend]]:
    yield Registration(
        "memory",
        MemoryStorage,
        config=MemoryStorageConfig,
        description="objects in a dict of this process only, for tests",
    )


@hookimpl
def ddlkit_loggers() -> Iterator[Registration[Logger]]:
    yield Registration("recording", RecordingLogger, description="keeps every call in memory, for tests")


@hookimpl
def ddlkit_compute_targets() -> Iterator[Registration[ComputeTarget]]:
    from .elsewhere import ElsewhereComputeConfig, ElsewhereTarget

    yield Registration(
        "elsewhere",
        ElsewhereTarget,
        config=ElsewhereComputeConfig,
        description="runs the job on a copy of its directory in a bare environment, as a "
        "remote cluster would; for tests",
    )
