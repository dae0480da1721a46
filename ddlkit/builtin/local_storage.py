"""A directory on this machine: the default storage backend. Data is read in place from where
`data.root` points; results stay in the job directory, or, with `storage.root` set, are also
copied to `<storage.root>/results/<job>` when the job ends. It needs nothing.

    ddlkit storage.root=/srv/ddlkit-results

For a share every node mounts use [storage=nfs](nfs.md); to stage a dataset onto each node's
local disk, [storage=local_ssd](local_ssd.md). [Datasets, staging and results](../datasets.md)
compares them.

## How it works

Objects (`put`/`get`) are files under `storage.root`, each written atomically; without a root
there is nowhere to keep them, and a plugin that asks is told to set one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_path
from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..interfaces import StorageBackend
from ..jobdir import RESULT_FILES
from ..registry import Registration


@dataclass
class LocalStorageConfig:
    # directory holding objects; results are copied to <root>/results/<job>. null: results stay
    # in the job directory and data is read from where data.root points
    root: str | None = None


class LocalStorage(StorageBackend):
    def __init__(self, cfg: LocalStorageConfig) -> None:
        super().__init__(cfg)
        self.root = Path(cfg.root).expanduser() if cfg.root else None

    def _path(self, key: str) -> Path:
        if self.root is None:
            raise ConfigError("storage=local has no storage.root; set storage.root=<directory> to store objects")
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"key {key!r} escapes the storage root")
        return path

    def put(self, local_path: Path, key: str) -> None:
        with atomic_path(self._path(key)) as tmp:
            shutil.copyfile(local_path, tmp)

    def get(self, key: str, local_path: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise FileNotFoundError(f"no object {key!r} in {self.root}")
        with atomic_path(Path(local_path)) as tmp:
            shutil.copyfile(src, tmp)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if self.root is None or not self.root.is_dir():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in self._files())
        return sorted(k for k in keys if k.startswith(prefix))

    def _files(self) -> Iterator[Path]:
        for p in self.root.rglob("*"):
            if p.is_file() and not any(part.startswith(".") and part.endswith(".tmp") for part in p.parts):
                yield p

    def publish_results(self, job_dir: Path, job_name: str) -> str | None:
        if self.root is None:
            return None
        for name in RESULT_FILES:
            if (job_dir / name).is_file():
                self.put(job_dir / name, f"results/{job_name}/{name}")
        return str(self.root / "results" / job_name)


@hookimpl
def ddlkit_storage_backends():
    yield Registration(
        "local",
        LocalStorage,
        config=LocalStorageConfig,
        description="a directory on this machine; results stay in the job directory",
    )
