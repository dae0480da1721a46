"""Helpers shared by the benchmarks: build a real ddlkit job in-process, and write results."""

from __future__ import annotations

import contextlib
import io
import json
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def make_job(job_dir: Path, overrides: Sequence[str]) -> Path:
    """Compose and validate ``overrides`` exactly as the ``ddlkit`` command does and write the
    job file; returns its path (run it with ``ddlkit.worker.main([str(path)])``)."""
    from hydra import compose, initialize_config_module

    from ddlkit import engine
    from ddlkit.config import store_schemas
    from ddlkit.plugins import get_plugin_manager
    from ddlkit.registry import Registry

    pm = get_plugin_manager()
    registry = Registry.collect(pm)
    store_schemas(registry)
    with initialize_config_module("ddlkit.conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    job = engine.prepare(cfg, job_dir=job_dir, overrides=overrides, registry=registry, pm=pm)
    return job.spec.job_file


def run_worker(job_file: Path) -> dict[str, Any]:
    """Run ddlkit's worker in this process (quietly) and return result.json."""
    from ddlkit import worker

    with contextlib.redirect_stdout(io.StringIO()):
        code = worker.main([str(job_file)])
    if code != 0:
        raise RuntimeError(f"ddlkit worker exited {code}; see {job_file.parent}/")
    return json.loads((job_file.parent / "result.json").read_text())


def summary(samples: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(samples), "samples": list(samples)}


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "cpus": __import__("os").cpu_count()}, **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
