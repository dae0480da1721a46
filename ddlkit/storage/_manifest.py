"""A dataset's manifest: every file with its size, content hash and label.

``manifest.tsv`` sits at the dataset's root and is what staging verifies a copy against, what
``ddlkit data upload`` compares remote objects with, and how a data source learns a dataset's
files and labels without listing a remote container::

    # ddlkit manifest v1
    path<TAB>size<TAB>sha256<TAB>label
    train/n01440764/n01440764_10026.JPEG<TAB>13697<TAB>9f2c...<TAB>n01440764

``path`` is relative to the root, ``/``-separated; ``label`` is the class folder of an image
under ``train/`` or ``validation/`` (empty for other files such as ``train.csv``). Tab-separated
rather than JSON because ImageNet's manifest has 1.3 million lines and is read on every rank.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..errors import ConfigError

MANIFEST_NAME = "manifest.tsv"
HEADER = "# ddlkit manifest v1\npath\tsize\tsha256\tlabel\n"
#: folders of an ImageNet-layout root whose sub-folders are classes
SPLIT_DIRS = ("train", "validation", "val")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    sha256: str
    label: str = ""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def label_of(rel_path: str) -> str:
    """The class of ``train/<class>/<file>`` (or ``validation/...``); empty for anything else."""
    parts = rel_path.split("/")
    return parts[1] if len(parts) == 3 and parts[0] in SPLIT_DIRS else ""


class Manifest:
    """An ordered list of :class:`Entry`, keyed by path."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries = sorted(entries, key=lambda e: e.path)
        self.by_path = {e.path: e for e in self.entries}

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def dumps(self) -> str:
        out = io.StringIO()
        out.write(HEADER)
        for e in self.entries:
            out.write(f"{e.path}\t{e.size}\t{e.sha256}\t{e.label}\n")
        return out.getvalue()

    @property
    def digest(self) -> str:
        """Identifies this exact content: two manifests with one digest describe the same files."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()

    def write(self, path: Path) -> None:
        from ..atomic import write_text

        write_text(path, self.dumps())

    @classmethod
    def loads(cls, text: str, origin: str = "manifest") -> Manifest:
        lines = text.splitlines()
        if not lines or not lines[0].startswith("# ddlkit manifest v1"):
            raise ConfigError(
                f"{origin} is not a ddlkit manifest (its first line must be '# ddlkit manifest v1'); "
                "write one with `ddlkit data manifest ROOT`."
            )
        entries = []
        for n, line in enumerate(lines[2:], start=3):
            fields = line.split("\t")
            if len(fields) != 4:
                raise ConfigError(
                    f"{origin}, line {n}: expected 4 tab-separated fields, found {len(fields)}; "
                    "rewrite it with `ddlkit data manifest ROOT`."
                )
            entries.append(Entry(fields[0], int(fields[1]), fields[2], fields[3]))
        return cls(entries)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        return cls.loads(Path(path).read_text(encoding="utf-8"), origin=str(path))


@runtime_checkable
class HashListing(Protocol):
    """A backend that can list its objects' sizes and content hashes without reading them
    (``ddlkit data upload`` then compares them with the manifest instead of re-uploading)."""

    def list_hashes(self, prefix: str = "") -> dict[str, tuple[int, str | None]]: ...


def iter_files(root: Path) -> Iterator[str]:
    """Relative ``/``-paths of the regular files under ``root``, skipping hidden files and folders
    (temporary files of interrupted copies, ``.DS_Store``) and the manifest itself."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        for name in sorted(filenames):
            if name.startswith(".") or (rel_dir == "." and name == MANIFEST_NAME):
                continue
            yield name if rel_dir == "." else f"{rel_dir}/{name}"


def build_manifest(root: Path, *, workers: int = 8, progress: Callable[[int], None] | None = None) -> Manifest:
    """Hash every file under ``root`` (in parallel: hashlib releases the GIL on large reads).
    ``progress(nbytes)`` is called once per file hashed."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    paths = list(iter_files(root))
    for p in paths:
        if "\t" in p or "\n" in p:
            raise ConfigError(f"{root / p}: file names with tabs or newlines cannot go in a manifest; rename it.")

    def one(rel: str) -> Entry:
        full = root / rel
        entry = Entry(rel, full.stat().st_size, sha256_file(full), label_of(rel))
        if progress is not None:
            progress(entry.size)
        return entry

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return Manifest(pool.map(one, paths))
