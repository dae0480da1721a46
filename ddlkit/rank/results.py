"""A completed run's results (``Run.result``): ``result.json``, written by rank 0 into the job
directory and published by the storage backend under the job's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..interfaces import StorageBackend
from ..jobdir import RESULT_FILE


def keep_results(result: dict[str, Any], job_dir: Path, storage: StorageBackend, name: str) -> None:
    """Write ``result`` as the job directory's result.json, then have ``storage`` publish the
    job's results under ``name`` (rank 0, once, at the end of a completed run)."""
    write_json(job_dir / RESULT_FILE, result)
    where = storage.publish_results(job_dir, name)
    if where:
        print(f"ddlkit: results published to {where}", flush=True)
