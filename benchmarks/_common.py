"""Helpers shared by the benchmarks: build a real ddlkit job in-process, and write results."""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
#: (width, height) of the benchmarks' generated JPEGs: ImageNet's most common sizes
PHOTO_SIZES = ((500, 375), (500, 333), (375, 500), (500, 400), (640, 480), (400, 300))


def save_photo_like(path: Path, i: int) -> None:
    """JPEG number ``i``: smooth structure plus texture, about ImageNet's bytes per pixel (quality 90)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(i)
    w, h = PHOTO_SIZES[i % len(PHOTO_SIZES)]
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        for _ in range(4):
            fx, fy, ph = rng.uniform(0.002, 0.05), rng.uniform(0.002, 0.05), rng.uniform(0, 6.28)
            img[..., c] += np.sin(x * fx + y * fy + ph) * rng.uniform(20, 60)
    img += rng.normal(0, 10, img.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(img + 128, 0, 255).astype(np.uint8)).save(path, quality=90)


def make_job(job_dir: Path, overrides: Sequence[str]) -> Path:
    """Compose and validate ``overrides`` exactly as the ``ddlkit`` command does and write the
    job file; returns its path (run it with ``ddlkit.rank.worker.main([str(path)])``)."""
    from hydra import compose, initialize_config_module

    from ddlkit.config import store_schemas
    from ddlkit.launch import prepare
    from ddlkit.plugins import get_plugin_manager
    from ddlkit.registry import Registry

    pm = get_plugin_manager()
    registry = Registry.collect(pm)
    store_schemas(registry)
    with initialize_config_module("ddlkit.conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    job = prepare.prepare(cfg, job_dir=job_dir, overrides=overrides, registry=registry, pm=pm)
    return job.spec.job_file


def run_worker(job_file: Path) -> dict[str, Any]:
    """Run ddlkit's worker in this process (quietly) and return result.json."""
    from ddlkit.jobdir import RESULT_FILE
    from ddlkit.rank import worker

    with contextlib.redirect_stdout(io.StringIO()):
        code = worker.main([str(job_file)])
    if code != 0:
        raise RuntimeError(f"ddlkit worker exited {code}; see {job_file.parent}/")
    return json.loads((job_file.parent / RESULT_FILE).read_text())


def one_thread_env() -> dict[str, str]:
    """This environment with one intra-op thread per rank: the benchmarks' ranks share few cores."""
    # TensorFlow's inter-op pool defaults to every core: without this one "single-thread" rank used ~1.5 cores
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def rank_workers(job_dir: Path) -> dict[int, dict[str, str]]:
    """The ddlkit rank workers of the job in ``job_dir`` (each runs ``-m ddlkit.rank.worker job.json``
    there): pid -> its environment (``OMPI_COMM_WORLD_RANK``, ``DDLKIT_NODE``, ...)."""
    from ddlkit.jobdir import JOB_FILE

    workers = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if Path(entry.path, "cmdline").read_bytes().split(b"\0")[1:4] != [
                b"-m",
                b"ddlkit.rank.worker",
                JOB_FILE.encode(),
            ]:
                continue
            if Path(os.readlink(Path(entry.path, "cwd"))) != job_dir.resolve():
                continue
            environ = Path(entry.path, "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        workers[int(entry.name)] = dict(v.decode(errors="replace").partition("=")[::2] for v in environ if b"=" in v)
    return workers


def summary(samples: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(samples), "samples": list(samples)}


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
        },
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def export(ref: str, dest: Path) -> Path:
    """The repository's files at git ``ref``, in ``dest``."""
    repo = Path(__file__).resolve().parent.parent
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def core_env(core: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this one) with an exported checkout's ``ddlkit`` and first-party plugins
    first on ``PYTHONPATH`` (the same module names as the installed ones, so they win)."""
    env = dict(os.environ if env is None else env)
    paths = [str(core), *(str(p) for p in sorted(core.glob("plugins/*/src")))]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
    return env


def run_before(ref: str, script: str, argv: Sequence[str], workdir: Path, result: str | None = None) -> dict[str, Any]:
    """Run benchmark ``script`` as it was at git ``ref``, on that revision's code, with ``argv``;
    return the JSON result it wrote, ``results/<result>.json`` (default: the script's name) in the
    exported tree, not in this one's."""
    core = export(ref, workdir / f"before-{ref}")
    proc = subprocess.run(
        [sys.executable, str(core / "benchmarks" / script), *argv],
        cwd=core,
        env=core_env(core),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{script} at {ref} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    print(proc.stdout, end="", flush=True)
    return json.loads((core / "benchmarks" / "results" / f"{result or Path(script).stem}.json").read_text())
