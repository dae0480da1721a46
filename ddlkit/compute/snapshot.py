"""The researcher's own code, shipped with a job to ranks that do not see the launcher's disk.

A job whose config names code in the directory ``ddlkit`` was started in (``model.target=my_pkg.nets:build``,
``data.target``, ``model.loss``, ``model.metrics``, ``trainer.callbacks``) needs that code where its ranks
run. On a target that shares the launcher's disk (``local``, ``local_mpi``, Slurm on a shared file
system) the ranks import it from there. For any other target the launcher takes a **snapshot** of the
launch directory into the job directory (``code/``, listed in ``code.json``), and the target carries
it along with the job's other files; the worker puts it first on the ranks' import path. This is
Azure ML's code snapshot and Ray's ``working_dir``, done once for every target.

What is left out: version control and build debris (``.git/``, ``__pycache__/``, virtual
environments, ``*.egg-info``), ddlkit's own outputs (``outputs/``, ``multirun/``, any job
directory), what ``.gitignore`` files ignore (each applies to its directory, as in git), what a
``.ddlkitignore`` in the launch directory ignores (same syntax; ``!pattern`` takes a file back),
and ``code.exclude``. Over ``code.max_mb`` the job is refused with the biggest files named.

The snapshot's ``digest`` is a SHA-256 over every path and content: the same tree gives the same
digest, so a target can upload one snapshot once and reuse it (content-addressed storage).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..errors import ConfigError
from ..jobdir import CODE_DIR, CODE_FILE, JOB_FILE

__all__ = ["ALWAYS_EXCLUDED", "CodeSnapshot", "IGNORE_FILE", "imports_from", "read_manifest"]

#: the launch directory's own ignore file, in ``.gitignore`` syntax
IGNORE_FILE = ".ddlkitignore"
#: never shipped: version control, caches, virtual environments, packaging debris, ddlkit's outputs
ALWAYS_EXCLUDED = (".git/", ".hg/", ".svn/", "__pycache__/", "*.py[cod]", ".venv/", "venv/", "env/",
                   "node_modules/", "*.egg-info/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".tox/",
                   ".ipynb_checkpoints/", "outputs/", "multirun/", ".ddlkit/", ".DS_Store")


def imports_from(directory: Path, import_paths: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ``(key, import path)`` pairs whose top-level module or package lives in ``directory``
    (found without importing anything): the code a snapshot of ``directory`` must carry."""
    found = []
    for key, path in import_paths:
        top = str(path).partition(":")[0].split(".")[0]
        if top and importlib.machinery.PathFinder.find_spec(top, [str(directory)]) is not None:
            found.append((key, path))
    return found


@dataclass(frozen=True)
class CodeSnapshot:
    """The files of a launch directory that a job ships, with their sizes and one digest."""

    #: the directory it was taken from (the launcher's; never written into the job)
    root: Path
    #: ``(path relative to root, in POSIX form, size in bytes)``, sorted by path
    files: tuple[tuple[str, int], ...]
    #: SHA-256 over every path and content, in hex
    digest: str

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)

    @classmethod
    def take(cls, root: Path, *, max_bytes: int, exclude: Sequence[str] = (),
             skip: Sequence[Path] = ()) -> CodeSnapshot:
        """Snapshot ``root`` as the module docstring says. ``exclude``: more ``.gitignore``-style
        patterns (``code.exclude``); ``skip``: directories left out whatever the patterns say
        (the job's own directory). Raises ConfigError when the files add up to over ``max_bytes``."""
        root = Path(root).resolve()
        skipped = {Path(p).resolve() for p in skip}
        files = sorted(_walk(root, _Rules(root, exclude), skipped))
        sizes = tuple((rel, (root / rel).stat().st_size) for rel in files)
        snapshot = cls(root, sizes, _digest(root, files))
        if snapshot.size > max_bytes:
            raise ConfigError(snapshot._too_big(max_bytes))
        return snapshot

    def describe(self) -> str:
        """One line: how many files, how big, which digest."""
        return f"{len(self.files)} files, {_human(self.size)}, sha256 {self.digest[:12]}"

    def write(self, job_dir: Path) -> Path:
        """Copy the files into ``job_dir/code`` (replacing an earlier snapshot) and list them in
        ``job_dir/code.json``; returns the code directory."""
        dest = Path(job_dir) / CODE_DIR
        staging = dest.with_name(f".{CODE_DIR}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        for rel, _ in self.files:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / rel, target)
        staging.mkdir(parents=True, exist_ok=True)  # an empty snapshot is still one
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        write_json(Path(job_dir) / CODE_FILE, self.manifest())
        return dest

    def manifest(self) -> dict[str, Any]:
        """``code.json``: the digest and every file with its size (no launcher path)."""
        return {"digest": self.digest, "size": self.size, "files": [{"path": p, "size": s} for p, s in self.files]}

    def _too_big(self, max_bytes: int) -> str:
        biggest = sorted(self.files, key=lambda f: (-f[1], f[0]))[:5]
        listed = ", ".join(f"{path} ({_human(size)})" for path, size in biggest)
        return (f"the code snapshot of {self.root} is {_human(self.size)} in {len(self.files)} files, over "
                f"code.max_mb={max_bytes / 1e6:g}; the biggest: {listed}. Leave data and outputs out with a "
                f"{IGNORE_FILE} (gitignore syntax) or code.exclude=[...], or raise code.max_mb.")


def read_manifest(job_dir: Path) -> Mapping[str, Any] | None:
    """The job's ``code.json``, or None when the job ships no code."""
    path = Path(job_dir) / CODE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


class _Rules:
    """Which paths are left out: the fixed list, ``code.exclude``, ``.ddlkitignore``, and each
    directory's ``.gitignore`` for the paths below it."""

    def __init__(self, root: Path, exclude: Sequence[str]) -> None:
        import pathspec

        self._spec = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_EXCLUDED, *exclude, *_lines(root / IGNORE_FILE)])
        self._gitignores: dict[Path, Any] = {}
        self._pathspec = pathspec

    def ignored(self, root: Path, path: Path, is_dir: bool) -> bool:
        suffix = "/" if is_dir else ""
        if self._spec.match_file(path.relative_to(root).as_posix() + suffix):
            return True
        # git's rule: a .gitignore applies to the paths below its own directory
        directory = path.parent
        while True:
            spec = self._gitignore(directory)
            if spec is not None and spec.match_file(path.relative_to(directory).as_posix() + suffix):
                return True
            if directory == root:
                return False
            directory = directory.parent

    def _gitignore(self, directory: Path) -> Any:
        if directory not in self._gitignores:
            lines = _lines(directory / ".gitignore")
            self._gitignores[directory] = self._pathspec.GitIgnoreSpec.from_lines(lines) if lines else None
        return self._gitignores[directory]


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.is_file() else []


def _walk(root: Path, rules: _Rules, skipped: set[Path]) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        # a job directory (ours or another run's) is output, not code
        dirnames[:] = sorted(d for d in dirnames if (here / d).resolve() not in skipped
                             and not (here / d / JOB_FILE).is_file() and not rules.ignored(root, here / d, True))
        for name in sorted(filenames):
            path = here / name
            if path.is_file() and not rules.ignored(root, path, False):
                yield path.relative_to(root).as_posix()


def _digest(root: Path, files: Sequence[str]) -> str:
    total = hashlib.sha256()
    for rel in files:
        total.update(rel.encode() + b"\0")
        with open(root / rel, "rb") as f:
            total.update(hashlib.file_digest(f, "sha256").digest())
    return total.hexdigest()


def _human(nbytes: float) -> str:
    for unit in ("B", "kB", "MB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"
