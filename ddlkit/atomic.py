"""Atomic writes: a reader sees the old file or the new one, never half of one.

Write to a temporary sibling, fsync, then ``os.replace`` (atomic on POSIX within a file
system). Directories (TensorFlow checkpoints are several files) are swapped by renaming.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(final: Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``final``, on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    target = tmp / final.name
    if directory:
        target.mkdir()
    try:
        yield target
        _fsync_tree(target)
        if final.is_dir():  # a directory cannot be os.replace'd over: swap it out first
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(target, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(target, final)
        _fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: Path, text: str) -> None:
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _fsync_tree(path: Path) -> None:
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in paths:
        with open(p, "rb") as f:
            os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
