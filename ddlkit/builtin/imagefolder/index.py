"""Which images a dataset holds, and their labels, read without decoding anything.

Three layouts, relative to the dataset root:

* **class folders** (ImageNet's): ``train/<class>/<image>`` and ``validation/<class>/<image>``
  (or ``val/``), any image extension in any case (``.JPEG``, ``.jpg``, ``.png``...). Classes are
  the sorted folder names under ``train/``. Listed from ``manifest.tsv`` when the root has one
  (fast on a share, and the only way for a ``blob://`` root), else by walking the folders.
* **CSV index** (the reference architecture's): ``train.csv`` and ``validation.csv`` with columns
  ``filenames`` (relative to ``train/`` and ``validation/``) and 1-based ``num_id``; a ``wnid``,
  ``label`` or ``class`` column, when present, names the classes.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError
from ...storage import MANIFEST_NAME, Manifest, is_url, open_storage

TRAIN_DIR = "train"
#: validation folder names, in order of preference
VAL_DIRS = ("validation", "val")
CSV_FILES = {"train": "train.csv", "val": "validation.csv"}
CSV_NAME_COLUMNS = ("wnid", "label", "class")
LAYOUTS = ("auto", "folders", "csv")


@dataclass(frozen=True)
class SplitIndex:
    #: image paths relative to the dataset root, ``/``-separated
    paths: tuple[str, ...]
    #: 0-based class of each image
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.paths)


@dataclass(frozen=True)
class DatasetIndex:
    classes: tuple[str, ...]
    train: SplitIndex
    val: SplitIndex
    #: "csv", "manifest" or "folders": where the listing came from
    source: str

    def split(self, name: str) -> SplitIndex:
        return self.train if name == "train" else self.val


class _Root:
    """Reads small files (manifest, CSVs) of a dataset root that is a directory or a URL."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.remote = open_storage(root) if is_url(root) else None
        self.path = None if self.remote else Path(root).expanduser()
        if self.path is not None and not self.path.is_dir():
            raise ConfigError(f"data.root={root} is not a directory on this node.")

    def read_text(self, name: str) -> str | None:
        if self.path is not None:
            p = self.path / name
            return p.read_text(encoding="utf-8") if p.is_file() else None
        with tempfile.TemporaryDirectory(prefix="ddlkit-index-") as tmp:
            try:
                self.remote.get(name, Path(tmp) / "f")
            except FileNotFoundError:
                return None
            return (Path(tmp) / "f").read_text(encoding="utf-8")


def load_index(root: str, layout: str = "auto") -> DatasetIndex:
    """The index of the dataset at ``root`` (a directory or a URL such as ``blob://c/imagenet``)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"data.layout={layout} is invalid: choose one of {', '.join(LAYOUTS)}.")
    src = _Root(root)
    train_csv = src.read_text(CSV_FILES["train"]) if layout in ("auto", "csv") else None
    if train_csv is not None:
        return _from_csv(root, train_csv, src.read_text(CSV_FILES["val"]))
    if layout == "csv":
        raise ConfigError(f"data.layout=csv but {root} has no {CSV_FILES['train']}.")
    manifest_text = src.read_text(MANIFEST_NAME)
    if manifest_text is not None:
        manifest = Manifest.loads(manifest_text, origin=f"{root}/{MANIFEST_NAME}")
        return _from_listing(root, [e.path for e in manifest.entries], "manifest")
    if src.path is None:
        raise ConfigError(
            f"{root} has no {MANIFEST_NAME}: a remote dataset is listed by its manifest. Upload it with "
            "`ddlkit data upload`, which writes one."
        )
    return _from_listing(root, _walk(src.path), "folders")


def _walk(root: Path) -> list[str]:
    found = []
    for split_dir in (TRAIN_DIR, *VAL_DIRS):
        base = root / split_dir
        if not base.is_dir():
            continue
        with os.scandir(base) as classes:
            for cls in classes:
                if cls.is_dir() and not cls.name.startswith("."):
                    found.append(f"{split_dir}/{cls.name}/")  # an empty class folder is still a class
                    with os.scandir(cls.path) as files:
                        found += [f"{split_dir}/{cls.name}/{f.name}" for f in files if f.is_file()]
    return found


def _from_listing(root: str, paths: list[str], source: str) -> DatasetIndex:
    from ...images import is_image  # numpy comes with it: only once a dataset is read

    by_split: dict[str, dict[str, list[str]]] = {}
    for p in paths:
        parts = p.split("/")
        if len(parts) != 3 or (parts[2] and not is_image(parts[2])):
            continue
        classes = by_split.setdefault(parts[0], {})
        files = classes.setdefault(parts[1], [])
        if parts[2]:
            files.append(p)
    if TRAIN_DIR not in by_split:
        raise ConfigError(
            f"data.root={root} has no {TRAIN_DIR}/<class>/<image> files. Expected ImageNet's layout "
            "(train/<class>/*.JPEG and validation/<class>/*.JPEG) or the CSV index (train.csv, validation.csv); "
            "for ImageNet's flat validation files run `ddlkit data prepare` first."
        )
    classes = tuple(sorted(by_split[TRAIN_DIR]))
    number = {c: i for i, c in enumerate(classes)}
    val_dir = next((d for d in VAL_DIRS if d in by_split), None)
    unknown = sorted(set(by_split.get(val_dir, {})) - set(classes)) if val_dir else []
    if unknown:
        raise ConfigError(
            f"data.root={root}: {val_dir}/ has classes that {TRAIN_DIR}/ lacks: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''}. Both splits must use the same class folders."
        )

    def split(name: str | None) -> SplitIndex:
        items = sorted((p, number[c]) for c, files in by_split.get(name, {}).items() for p in files) if name else []
        return SplitIndex(tuple(p for p, _ in items), tuple(label for _, label in items))

    return DatasetIndex(classes, split(TRAIN_DIR), split(val_dir), source)


def _from_csv(root: str, train_text: str, val_text: str | None) -> DatasetIndex:
    names: dict[int, str] = {}

    def read(text: str, name: str, folder: str) -> SplitIndex:
        rows = list(csv.DictReader(io.StringIO(text)))
        missing = {"filenames", "num_id"} - set(rows[0] if rows else {})
        if missing:
            raise ConfigError(
                f"{root}/{name} lacks the column(s) {', '.join(sorted(missing))}: the CSV index needs "
                "`filenames` and 1-based `num_id`."
            )
        name_col = next((c for c in CSV_NAME_COLUMNS if c in rows[0]), None)
        paths, labels = [], []
        for n, row in enumerate(rows, start=2):
            try:
                num = int(row["num_id"])
            except ValueError:
                raise ConfigError(f"{root}/{name}, line {n}: num_id {row['num_id']!r} is not an integer.") from None
            if num < 1:
                raise ConfigError(f"{root}/{name}, line {n}: num_id is 1-based, found {num}.")
            paths.append(f"{folder}/{row['filenames'].strip().lstrip('/')}")
            labels.append(num - 1)
            if name_col:
                names.setdefault(num - 1, row[name_col])
        return SplitIndex(tuple(paths), tuple(labels))

    train = read(train_text, CSV_FILES["train"], TRAIN_DIR)
    val = read(val_text, CSV_FILES["val"], VAL_DIRS[0]) if val_text is not None else SplitIndex((), ())
    num_classes = max(train.labels + val.labels) + 1
    return DatasetIndex(tuple(names.get(i, str(i + 1)) for i in range(num_classes)), train, val, "csv")
