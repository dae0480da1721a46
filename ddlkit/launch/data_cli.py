"""``ddlkit data ...``: get a dataset ready to train on.

    ddlkit data prepare OUT --val-images DIR --val-labels FILE [--synsets FILE] [--train DIR] [--copy]
    ddlkit data manifest ROOT
    ddlkit data upload SRC DEST        # DEST: blob://container/prefix or a directory

``prepare`` turns ImageNet's official validation layout (50,000 flat files plus a label list)
into ``OUT/validation/<wnid>/`` class folders, and links ``--train`` in as ``OUT/train``, with
hard links (copies across file systems, or with ``--copy``): the source is never moved or
changed, unlike the reference's ``valprep.sh``. Re-running it finishes an interrupted run. It
ends by writing ``OUT/manifest.tsv``.

The label list may be: one wnid per line (the order of the sorted file names, as TensorFlow's
``imagenet_2012_validation_synset_labels.txt``); ``<file> <wnid>`` pairs, or Kaggle's
``LOC_val_solution.csv``; or the devkit's 1-based class ids
(``ILSVRC2012_validation_ground_truth.txt``), which need ``--synsets`` (one wnid per line,
first word, in the devkit's id order).

``upload`` copies a directory to storage in parallel, skipping files whose content hash the
destination already has (so re-running it resumes an interrupted upload), with a progress
bar, and uploads the manifest last: a manifest at the destination means the upload finished.
"""

from __future__ import annotations

import argparse
import csv
import errno
import io
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError, DdlkitError, exit_code_for

_WNID = re.compile(r"^n\d{8}$")
DEFAULT_WORKERS = 16


# ---------------------------------------------------------------------------- prepare
def read_val_labels(text: str, images: list[str], synsets: list[str] | None) -> dict[str, str]:
    """``{image file name: wnid}`` from a validation label list in any of the supported forms."""
    by_stem = {Path(name).stem: name for name in images}
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ConfigError("the validation label file is empty")
    if lines[0].lower().startswith("imageid"):  # Kaggle's LOC_val_solution.csv
        rows = [(r[0], r[1].split()[0]) for r in csv.reader(io.StringIO("\n".join(lines[1:]))) if len(r) >= 2]
    elif all(len(re.split(r"[,\s]+", ln)) >= 2 for ln in lines):
        rows = [tuple(re.split(r"[,\s]+", ln)[:2]) for ln in lines]
    else:
        if len(lines) != len(images):
            raise ConfigError(
                f"the label file has {len(lines)} labels for {len(images)} images; a one-label-per-line "
                "file must list the images in the order of their sorted file names."
            )
        rows = list(zip(sorted(images), lines, strict=True))
    labels: dict[str, str] = {}
    for image, label in rows:
        name = by_stem.get(Path(image).stem)
        if name is None:
            raise ConfigError(f"the label file names {image!r}, which is not among the validation images.")
        labels[name] = _wnid(label, synsets)
    missing = sorted(set(images) - set(labels))
    if missing:
        raise ConfigError(f"{len(missing)} validation images have no label, e.g. {missing[0]}.")
    return labels


def _wnid(label: str, synsets: list[str] | None) -> str:
    if _WNID.match(label):
        return label
    if label.isdigit():
        if synsets is None:
            raise ConfigError(
                f"the label file holds class ids ({label}); pass --synsets FILE to name them "
                "(one wnid per line, in the devkit's id order)."
            )
        if not 1 <= int(label) <= len(synsets):
            raise ConfigError(f"class id {label} is outside the {len(synsets)} synsets (ids are 1-based).")
        return synsets[int(label) - 1]
    raise ConfigError(f"{label!r} is neither a WordNet id (n01440764) nor a class id.")


def _link(src: Path, dst: Path, copy: bool) -> bool:
    """Hard-link (or copy) ``src`` to ``dst``; returns whether it fell back to copying."""
    if dst.exists():
        if dst.samefile(src) or (dst.stat().st_size == src.stat().st_size):
            return False
        raise ConfigError(f"{dst} exists and differs from {src}; remove it or choose another output directory.")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not copy:
        try:
            os.link(src, dst)
            return False
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return True


def prepare(
    out: Path,
    *,
    val_images: Path | None,
    val_labels: Path | None,
    synsets: Path | None,
    train: Path | None,
    copy: bool,
    workers: int,
) -> int:
    from ..images import is_image

    out = Path(out)
    copied = linked = 0
    if val_images is not None:
        if val_labels is None:
            raise ConfigError("--val-images needs --val-labels FILE")
        images = sorted(p.name for p in Path(val_images).iterdir() if p.is_file() and is_image(p.name))
        if not images:
            raise ConfigError(f"{val_images} holds no images")
        names = None
        if synsets is not None:
            names = [ln.split()[0] for ln in Path(synsets).read_text().splitlines() if ln.strip()]
        labels = read_val_labels(Path(val_labels).read_text(encoding="utf-8"), images, names)
        for name in images:
            fell_back = _link(Path(val_images) / name, out / "validation" / labels[name] / name, copy)
            copied += fell_back
            linked += not fell_back
    if train is not None:
        for cls in sorted(d for d in Path(train).iterdir() if d.is_dir() and not d.name.startswith(".")):
            for f in sorted(cls.iterdir()):
                if f.is_file() and is_image(f.name):
                    fell_back = _link(f, out / "train" / cls.name / f.name, copy)
                    copied += fell_back
                    linked += not fell_back
    print(f"ddlkit: {linked} files linked, {copied} copied into {out}; the source is unchanged")
    return write_manifest(out, workers)


# ---------------------------------------------------------------------------- manifest, upload
def write_manifest(root: Path, workers: int) -> int:
    from ..storage import build_manifest
    from ..storage._manifest import iter_files
    from ..storage._parallel import Progress

    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    progress = Progress(f"hashing {root}", sum((root / p).stat().st_size for p in iter_files(root)))
    try:
        manifest = build_manifest(root, workers=workers, progress=progress.advance)
    finally:
        progress.close()
    manifest.write(root / "manifest.tsv")
    print(f"ddlkit: wrote {root / 'manifest.tsv'} ({len(manifest)} files, {manifest.total_bytes / 1e6:.1f} MB)")
    return 0


def upload(src: Path, dest: str, *, workers: int) -> int:
    from ..storage import MANIFEST_NAME, HashListing, Manifest, build_manifest, open_storage, retry, sha256_file
    from ..storage._parallel import Progress, parallel

    src = Path(src)
    if not src.is_dir():
        raise ConfigError(f"{src} is not a directory")
    t0 = time.perf_counter()
    if (src / MANIFEST_NAME).is_file():
        manifest = Manifest.read(src / MANIFEST_NAME)
        stale = [
            e.path for e in manifest.entries if not (src / e.path).is_file() or (src / e.path).stat().st_size != e.size
        ]
        if stale:
            raise ConfigError(
                f"{src}/{MANIFEST_NAME} does not match the files ({len(stale)} differ, e.g. {stale[0]}); "
                f"rewrite it with `ddlkit data manifest {src}`."
            )
    else:
        print(f"ddlkit: {src} has no {MANIFEST_NAME}; hashing its files", file=sys.stderr)
        manifest = build_manifest(src, workers=workers)
    backend = open_storage(dest)
    if isinstance(backend, HashListing):
        remote = backend.list_hashes()
    else:  # a directory: hash what is there with the right size
        root = getattr(backend, "root", None)
        remote = {
            e.path: (e.size, sha256_file(root / e.path))
            for e in manifest.entries
            if root is not None and (root / e.path).is_file() and (root / e.path).stat().st_size == e.size
        }
    todo = [e for e in manifest.entries if remote.get(e.path) != (e.size, e.sha256)]
    nbytes = sum(e.size for e in todo)
    progress = Progress(f"uploading to {dest}", nbytes)

    def put(entry) -> None:
        retry(lambda: backend.put(src / entry.path, entry.path), what=f"uploading {entry.path}")
        progress.advance(entry.size)

    try:
        parallel(put, todo, workers)
    finally:
        progress.close()
    # last: a manifest at the destination means every file it lists arrived
    with tempfile.TemporaryDirectory(prefix="ddlkit-upload-") as tmp:
        manifest.write(Path(tmp) / MANIFEST_NAME)
        retry(lambda: backend.put(Path(tmp) / MANIFEST_NAME, MANIFEST_NAME), what=f"uploading {MANIFEST_NAME}")
    seconds = time.perf_counter() - t0
    print(
        f"ddlkit: uploaded {len(todo)} files ({nbytes / 1e6:.1f} MB) to {dest} in {seconds:.1f}s; "
        f"{len(manifest) - len(todo)} were already there"
    )
    return 0


# ---------------------------------------------------------------------------- the command
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddlkit data", description="Prepare, describe and upload datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "prepare", help="ImageNet's flat validation files -> class folders (source untouched), plus a manifest"
    )
    p.add_argument("out", type=Path, help="the dataset root to create (train/, validation/, manifest.tsv)")
    p.add_argument("--val-images", type=Path, help="folder of the flat validation images")
    p.add_argument(
        "--val-labels",
        type=Path,
        help="their labels (wnids per line, file/wnid pairs, LOC_val_solution.csv, or class ids with --synsets)",
    )
    p.add_argument("--synsets", type=Path, help="wnids in class-id order (for class-id label files)")
    p.add_argument("--train", type=Path, help="folder of train/<wnid>/ class folders to link in as OUT/train")
    p.add_argument("--copy", action="store_true", help="copy instead of hard-linking")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="parallel hashing threads")
    m = sub.add_parser("manifest", help="write ROOT/manifest.tsv (path, size, sha256, label of every file)")
    m.add_argument("root", type=Path)
    m.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    u = sub.add_parser("upload", help="copy a dataset to blob://container/prefix (or a directory), resumably")
    u.add_argument("src", type=Path)
    u.add_argument("dest", help="blob://container/prefix or a directory")
    u.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="parallel uploads")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            if args.val_images is None and args.train is None:
                raise ConfigError("nothing to prepare: give --val-images/--val-labels and/or --train")
            return prepare(
                args.out,
                val_images=args.val_images,
                val_labels=args.val_labels,
                synsets=args.synsets,
                train=args.train,
                copy=args.copy,
                workers=args.workers,
            )
        if args.command == "manifest":
            return write_manifest(args.root, args.workers)
        return upload(args.src, args.dest, workers=args.workers)
    except DdlkitError as err:
        print(f"ddlkit: error: {err}", file=sys.stderr)
        return exit_code_for(err)
    except OSError as err:
        print(f"ddlkit: error: {err}", file=sys.stderr)
        return 1
