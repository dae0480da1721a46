"""Atomic writes: a reader sees the old file or the new one, never half of one.

Write to a temporary sibling, fsync, then ``os.replace`` (atomic on POSIX within a file
system). Directories (TensorFlow checkpoints are several files) are swapped by renaming.

:func:`hold_lock` gives a directory one writer (a job directory, a sweep directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


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
        put_in_place(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def temporary_sibling(final: Path, tag: str) -> Path:
    """A temporary path for ``final`` that every process computes alike (``tag`` tells writers
    apart), inside a directory that :func:`ddlkit.checkpoint.remove_stale` recognises as an
    interrupted write's: for several processes writing one directory together."""
    final = Path(final)
    return final.parent / f".{final.name}.{tag}.tmp" / final.name


def put_in_place(written: Path, final: Path) -> None:
    """Make the file or directory ``written`` (complete) ``final``: fsync it, rename it over
    ``final`` (a directory is swapped out first: it cannot be renamed over), fsync the directory."""
    _fsync_tree(written)
    if final.is_dir():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(written, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(written, final)
    _fsync_dir(final.parent)


def write_text(path: Path, text: str) -> None:
    try:
        with atomic_path(Path(path)) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as err:
        if err.filename is None:  # a write that ran out of room names no file: name the one being written
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def replace_text(path: Path, text: str) -> None:
    """Replace ``path`` whole with ``text`` (a reader sees the old file or the new one), without
    syncing it to disk: for views rewritten often (a progress file), where a crash may lose the
    latest but must not leave half of one."""
    tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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


class LockHeld(Exception):
    """Another process holds the lock; the message is what it wrote there (``pid N on HOST``)."""


def hold_lock(path: Path) -> TextIO:
    """Take the kernel's lock on ``path`` (``lockf``, which NFS shares too) and write there which
    process holds it, or raise :class:`LockHeld`. The lock lasts while the returned file is open
    and is released on any exit, SIGKILL included: no stale lock to clear by hand."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+", encoding="utf-8")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise LockHeld(holder) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f
