"""Where checkpoints live in a job directory, how they are verified, and which one a run resumes from.

Layout of ``<job_dir>/checkpoints/``:

* ``step-00000120.ckpt``: a checkpoint (a file or a directory, as the framework writes it),
  written atomically (:func:`ddlkit.atomic.atomic_path`);
* ``step-00000120.ckpt.manifest.json``: its manifest, the size and checksum of each of its files
  (``trainer.checkpoint_checksum``: CRC-32 or SHA-256; the entry's key names the algorithm),
  taken from the bytes just written and renamed into place *before* the checkpoint is, so a
  checkpoint written by this version of ddlkit always has one;
* ``latest``: a one-line pointer, replaced atomically only after the checkpoint and its manifest
  are complete and the checkpoint matches its manifest. Older checkpoints are deleted only then.
* ``best.ckpt`` (and its manifest): with ``trainer.best_checkpoint.monitor``, the checkpoint of
  the best validation so far (:func:`keep_best`); the rotation never deletes it, and resuming
  never picks it (``trainer.resume=<job>/checkpoints/best.ckpt`` does).

Resuming (:func:`resolve_resume`) verifies the checkpoint ``latest`` names against its manifest
and falls back to the newest older checkpoint that verifies, with a warning that names every
damaged or missing checkpoint it passed over and the one it uses. Damaged checkpoints are never
deleted by resuming. A checkpoint without a manifest (written by an older ddlkit, or by hand) is
used as it is, unverified.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .atomic import atomic_path, write_json, write_text
from .errors import ConfigError, RunError
from .jobdir import CHECKPOINT_DIR

LATEST = "latest"
#: the kept checkpoint of the best validation (trainer.best_checkpoint)
BEST = "best.ckpt"
#: appended to a checkpoint's name: its manifest
MANIFEST_SUFFIX = ".manifest.json"
#: 2: a file's checksum may be a CRC-32 (version 1 had SHA-256 only)
MANIFEST_VERSION = 2
#: ``trainer.checkpoint_checksum``: what a manifest keeps of each file's content. CRC-32 (the
#: default) detects what damages checkpoints -- a truncated or partly written file, flipped bits
#: -- at ten times the speed of SHA-256 on a CPU without SHA instructions (3 GB/s against 0.38
#: here), as object stores' own integrity checks do (CRC-32C/CRC-64 in Azure Blob, S3, GCS).
#: SHA-256 also identifies the bytes (provenance, signing): another file with the same digest
#: cannot be made.
CHECKSUMS = {"crc32": "CRC-32", "sha256": "SHA-256"}
_STEP_NAME = re.compile(r"^step-\d{8,}\.ckpt$")

Warn = Callable[[str], None]


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.ckpt"


def checkpoint_step(path: Path) -> int | None:
    """The optimizer step a checkpoint was saved at, from its name (None for another name)."""
    name = Path(path).name
    return int(name[len("step-") : -len(".ckpt")]) if _STEP_NAME.match(name) else None


def _warn(message: str) -> None:
    print(f"ddlkit: warning: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- manifests
def manifest_path(checkpoint: Path) -> Path:
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + MANIFEST_SUFFIX)


def _files(path: Path) -> list[tuple[str, Path]]:
    """A checkpoint's files as (name in the manifest, path): the file itself, or every file below the directory."""
    if path.is_dir():
        return sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*") if p.is_file())
    return [(".", path)]


def checksum(path: Path, algorithm: str) -> str:
    """The hex checksum of the file at ``path``: ``crc32`` or ``sha256`` (see :data:`CHECKSUMS`)."""
    with open(path, "rb") as f:
        if algorithm == "sha256":
            return hashlib.file_digest(f, "sha256").hexdigest()
        crc = 0
        while chunk := f.read(1 << 23):
            crc = zlib.crc32(chunk, crc)
        return f"{crc:08x}"


def build_manifest(path: Path, checksum_algorithm: str = "crc32") -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (a file or a directory): size and checksum of each file."""
    path = Path(path)
    files = {
        name: {"size": p.stat().st_size, checksum_algorithm: checksum(p, checksum_algorithm)}
        for name, p in _files(path)
    }
    return {
        "version": MANIFEST_VERSION,
        "checkpoint": path.name,
        "kind": "directory" if path.is_dir() else "file",
        "bytes": sum(f["size"] for f in files.values()),
        "files": files,
    }


def write_manifest(checkpoint: Path, manifest: dict[str, Any] | None = None) -> Path:
    """Write ``checkpoint``'s manifest next to it (atomically); ``manifest`` defaults to one built from it."""
    target = manifest_path(checkpoint)
    write_json(target, manifest if manifest is not None else build_manifest(checkpoint))
    return target


def read_manifest(checkpoint: Path) -> dict[str, Any] | None:
    """``checkpoint``'s manifest, or None if it has none. A manifest that cannot be read is an error."""
    try:
        text = manifest_path(checkpoint).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    manifest = json.loads(text)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError("not a checkpoint manifest")
    return manifest


def verify(checkpoint: Path, *, hashes: bool = True) -> str | None:
    """Why ``checkpoint`` cannot be trusted, or None if it matches its manifest (sizes, and the
    checksum of every file when ``hashes``). A checkpoint without a manifest passes unverified:
    use :func:`read_manifest` to tell the two apart."""
    checkpoint = Path(checkpoint)
    if not checkpoint.exists():
        return "it does not exist"
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError) as err:
        return f"its manifest {manifest_path(checkpoint).name} cannot be read ({err})"
    if manifest is None:
        return None
    is_dir = checkpoint.is_dir()
    if (manifest.get("kind") == "directory") != is_dir:
        return f"it is a {'directory' if is_dir else 'file'}, its manifest describes a {manifest.get('kind')}"
    for name, entry in manifest["files"].items():
        file = checkpoint if name == "." else checkpoint / name
        shown = checkpoint.name if name == "." else f"{checkpoint.name}/{name}"
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            return f"{shown} is missing"
        if size != entry["size"]:
            what = "truncated" if size < entry["size"] else "longer than written"
            return f"{shown} is {size} bytes, {entry['size']} were written ({what})"
        algorithm = next((a for a in CHECKSUMS if a in entry), None)
        if hashes and algorithm is not None and checksum(file, algorithm) != entry[algorithm]:
            return f"{shown} does not match its {CHECKSUMS[algorithm]} (corrupted)"
    return None


# ---------------------------------------------------------------------------- the latest pointer
def latest_checkpoint(job_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, if it exists (not verified: see :func:`resolve_resume`)."""
    pointer = Path(job_dir) / CHECKPOINT_DIR / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    if not name:
        return None
    path = pointer.parent / name
    return path if path.exists() else None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def mark_latest(path: Path, keep: int) -> None:
    """Point ``latest`` at ``path`` and delete all but the newest ``keep`` checkpoints.

    ``path`` must match its manifest first (sizes: its hashes were taken from the very bytes
    written): an unverified checkpoint replaces nothing, so this raises :class:`RunError` and
    neither moves the pointer nor deletes anything."""
    path = Path(path)
    if read_manifest(path) is None:
        raise RunError(
            f"checkpoint {path} has no manifest ({manifest_path(path).name}); it was not written "
            "completely, so the pointer stays and no older checkpoint is deleted",
            component="checkpoint",
        )
    problem = verify(path, hashes=False)
    if problem is not None:
        raise RunError(
            f"checkpoint {path} does not match its manifest after writing: {problem}. The pointer stays "
            "and no older checkpoint is deleted",
            component="checkpoint",
        )
    write_text(path.parent / LATEST, path.name + "\n")
    older = sorted(p for p in path.parent.glob("step-*.ckpt") if p.name < path.name)
    for old in older[: max(len(older) - (keep - 1), 0)]:
        _remove(old)
        manifest_path(old).unlink(missing_ok=True)


def keep_best(checkpoint: Path, best: Path) -> None:
    """Keep ``checkpoint`` also as ``best``, atomically, with a manifest (written first, as a step
    checkpoint's is): hard links where the file system has them (no copy; rotating the step
    checkpoint out leaves them), else a copy."""
    checkpoint = Path(checkpoint)
    manifest = read_manifest(checkpoint) or build_manifest(checkpoint)
    with atomic_path(best) as tmp:
        if checkpoint.is_dir():
            shutil.copytree(checkpoint, tmp, copy_function=_link_or_copy)
        else:
            _link_or_copy(checkpoint, tmp)
        write_manifest(best, {**manifest, "checkpoint": Path(best).name})


def _link_or_copy(source: Path | str, target: Path | str) -> None:
    try:
        os.link(source, target)
    except OSError:  # no hard links here (another file system, some network mounts)
        shutil.copy2(source, target)


def remove_stale(checkpoint_dir: Path) -> list[Path]:
    """Remove what interrupted checkpoint writes left behind in ``checkpoint_dir``: atomic
    writes' temporaries (``.step-N.ckpt.*.tmp``, ``.latest.*.tmp``, ...), a directory swap's
    ``.step-N.ckpt.old``, and manifests whose checkpoint never arrived.
    Call it before a run writes its first checkpoint, never while another writes there."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    removed = [
        p
        for p in checkpoint_dir.iterdir()
        if p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.endswith(".ckpt.old"))
    ]
    for m in checkpoint_dir.glob("step-*.ckpt" + MANIFEST_SUFFIX):
        if not m.with_name(m.name[: -len(MANIFEST_SUFFIX)]).exists():
            removed.append(m)
    for p in removed:
        _remove(p)
    return removed


# ---------------------------------------------------------------------------- disk full
_NO_SPACE = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded"}


def no_space(err: BaseException, directory: Path, *, slack: int = 1 << 20) -> str | None:
    """``"no space left"`` (or ``"disk quota exceeded"``) if ``err`` came from a full file system
    under ``directory``, else None. Frameworks do not all raise an OSError for it (PyTorch: a
    ``RuntimeError: ... unexpected pos``), so after any other error the file system is asked how
    much room is left: less than ``slack`` bytes counts as full (call this before removing what the
    failed write left)."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return _NO_SPACE[e.errno]
        e = e.__cause__ or e.__context__
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    return "no space left" if free < slack else None


# ---------------------------------------------------------------------------- resume
def rotated_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """The directory's rotated checkpoints (``step-*.ckpt``, not ``best.ckpt``), newest first."""
    if not checkpoint_dir.is_dir():
        return []
    return sorted(
        (p for p in checkpoint_dir.glob("step-*.ckpt") if _STEP_NAME.match(p.name)), key=lambda p: p.name, reverse=True
    )


def _choose(job_dir: Path, warn: Warn) -> tuple[Path | None, bool]:
    """The newest intact checkpoint of ``job_dir`` at or before the one ``latest`` names, and
    whether the directory holds any trace of an earlier run (a pointer or a checkpoint)."""
    checkpoint_dir = Path(job_dir) / CHECKPOINT_DIR
    pointer = checkpoint_dir / LATEST
    found = rotated_checkpoints(checkpoint_dir)
    notes: list[str] = []
    name = (pointer.read_text(encoding="utf-8").strip() or None) if pointer.is_file() else None
    if name is None:
        if not found:
            return None, False
        notes.append(f"{pointer} is missing")
        candidates = found
    elif not _STEP_NAME.match(name):
        notes.append(f"{pointer} names {name!r}, not a checkpoint")
        candidates = found
    else:
        # a checkpoint newer than the pointer's was never marked complete (or belongs to an earlier
        # run that a fresh start left behind): it is not this run's latest state
        candidates = [p for p in found if p.name <= name]
        if not (checkpoint_dir / name).exists():
            notes.append(f"{pointer} names {name}, which does not exist (deleted?)")
    bad: list[str] = []
    for path in candidates:
        problem = verify(path)
        if problem is None:
            if notes or bad:
                for line in notes + bad:
                    warn(line)
                unverified = " (it has no manifest, so it is not verified)" if read_manifest(path) is None else ""
                warn(
                    f"resuming from {path}, the newest intact checkpoint{unverified}; damaged checkpoints are "
                    "kept for inspection"
                )
            return path, True
        bad.append(f"checkpoint {path} is damaged: {problem}; skipped")
    details = "; ".join(notes + [b.removesuffix("; skipped") for b in bad]) or f"{pointer} names no checkpoint"
    raise ConfigError(
        f"{checkpoint_dir} holds no intact checkpoint to resume from ({details}). Resume from another one with "
        "trainer.resume=<path>, or start fresh with trainer.resume=false (nothing is deleted until a new "
        "checkpoint is complete)."
    )


#: the trainer.resume words (any case) that start fresh, and that take the job directory's latest checkpoint;
#: anything else is a path
RESUME_FRESH = ("false", "no", "off", "none", "null")
RESUME_LATEST = ("auto", "true", "yes", "on")


def resume_path(resume: object) -> bool:
    """Whether ``trainer.resume`` names a checkpoint or job directory (not one of its words)."""
    return str(resume).strip().lower() not in (*RESUME_FRESH, *RESUME_LATEST)


def resolve_resume(job_dir: Path, resume: object, *, warn: Warn = _warn) -> Path | None:
    """Turn ``trainer.resume`` into the checkpoint to load, or None to start fresh.

    ``auto`` (default): the job directory's latest intact checkpoint if there is one;
    ``true``: that checkpoint, and an error if there is none; ``false``: start fresh;
    anything else: a path to a checkpoint, or to a job directory (its latest intact checkpoint).

    A latest checkpoint that is missing or does not match its manifest is passed over for the
    newest older one that does, with a warning (through ``warn``) naming each one passed over
    and the one chosen. A job directory with checkpoints but none intact is a
    :class:`ConfigError` (exit 2), never a silent fresh start.
    """
    value = str(resume).strip()
    mode = value.lower()
    if mode in RESUME_FRESH:
        return None
    if mode in RESUME_LATEST:
        latest, _ = _choose(Path(job_dir), warn)
        if latest is None and mode != "auto":
            raise ConfigError(
                f"trainer.resume=true but {job_dir}/{CHECKPOINT_DIR} holds no checkpoint. Point the run at the "
                "earlier job's directory with hydra.run.dir=<dir>, or pass trainer.resume=<path to checkpoint>."
            )
        return latest
    path = Path(value).expanduser()
    if path.is_dir() and (path / CHECKPOINT_DIR).is_dir():  # a job directory was given
        found, _ = _choose(path, warn)
        if found is not None:
            return found
    if not path.exists():
        raise ConfigError(f"trainer.resume={value}: no such checkpoint. Use auto, true, false or an existing path.")
    problem = verify(path)
    if problem is not None:
        raise ConfigError(
            f"trainer.resume={value}: checkpoint {path} is damaged: {problem}. Pass another "
            "checkpoint, or start fresh with trainer.resume=false."
        )
    return path.resolve()
