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
and ``code.exclude``. Over ``code.max_mb`` the job is refused with the biggest files named, before
any file is read.

Secrets never travel by accident: credential files (:data:`CREDENTIALS`: ``.env`` files, keys and
certificates, ``.netrc``, the cloud CLIs' configuration directories) are left out too, and ``ddlkit
plan`` names each one; a ``!path`` line in ``.ddlkitignore`` (or ``code.exclude=['!path']``) takes
one back on purpose. Symbolic links are never followed out of the tree (a link to
``/proc/self/environ`` would ship the launcher's environment): a link to a path inside it ships
as a link, one that leaves it (or leads nowhere) is left out and named in the plan.

The snapshot's ``digest`` is a SHA-256 over every path and content: the same tree gives the same
digest, so a target can upload one snapshot once and reuse it (content-addressed storage).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..errors import ConfigError
from ..jobdir import CODE_DIR, CODE_FILE, JOB_FILE

__all__ = ["ALWAYS_EXCLUDED", "CREDENTIALS", "CodeSnapshot", "IGNORE_FILE", "imports_from", "read_manifest"]

#: the launch directory's own ignore file, in ``.gitignore`` syntax
IGNORE_FILE = ".ddlkitignore"
#: never shipped: version control, caches, virtual environments, packaging debris, ddlkit's outputs
ALWAYS_EXCLUDED = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.py[cod]",
    ".venv/",
    "venv/",
    "env/",
    "node_modules/",
    "*.egg-info/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
    ".ipynb_checkpoints/",
    "outputs/",
    "multirun/",
    ".ddlkit/",
    ".DS_Store",
)
#: never shipped unless taken back with ``!path``: credential files, and the directories where SSH,
#: the cloud CLIs, Kubernetes and Docker keep theirs (SSH keys by their names, not every ``id_*``:
#: ``id_utils.py`` is code)
CREDENTIALS = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    "credentials*.json",
    ".ssh/",
    ".aws/",
    ".azure/",
    "**/.config/gcloud/",
    ".kube/",
    ".docker/",
)


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
    #: ``(path, target)`` of the symbolic links shipped as links (each to a path inside the tree;
    #: the target relative to the link's directory)
    links: tuple[tuple[str, str], ...] = ()
    #: what :data:`CREDENTIALS` left out (directories end in ``/``)
    withheld: tuple[str, ...] = ()
    #: ``(path, target)`` of the symbolic links left out: they leave the tree or lead nowhere
    outside_links: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)

    @classmethod
    def take(
        cls, root: Path, *, max_bytes: int, exclude: Sequence[str] = (), skip: Sequence[Path] = ()
    ) -> CodeSnapshot:
        """Snapshot ``root`` as the module docstring says. ``exclude``: more ``.gitignore``-style
        patterns (``code.exclude``); ``skip``: directories left out whatever the patterns say
        (the job's own directory). Raises ConfigError when the files add up to over ``max_bytes``."""
        root = Path(root).resolve()
        skipped = {Path(p).resolve() for p in skip}
        walk = _Walk(root, _Rules(root, exclude), skipped)
        files = sorted(walk.files)
        sizes = tuple((rel, _read(root / rel, os.stat).st_size) for rel in files)
        # the sizes before any content: a 3 GB file is refused at once, not after hashing it
        listed = cls(
            root, sizes, "", tuple(sorted(walk.links)), tuple(sorted(walk.withheld)), tuple(sorted(walk.outside))
        )
        if listed.size > max_bytes:
            raise ConfigError(listed._too_big(max_bytes))
        return dataclasses.replace(listed, digest=_digest(root, files, listed.links))

    def describe(self) -> str:
        """One line: how many files, how big, which digest."""
        links = f" and {len(self.links)} links" if self.links else ""
        return f"{len(self.files)} files{links}, {_human(self.size)}, sha256 {self.digest[:12]}"

    def left_out(self) -> list[str]:
        """What ``ddlkit plan`` says the snapshot left out that a user may not expect: credential
        files, and links out of the tree."""
        said = []
        if self.withheld:
            said.append(
                f"left out as credentials: {', '.join(self.withheld)} (to ship one, add !<path> to {IGNORE_FILE})"
            )
        if self.outside_links:
            said.append(
                "symbolic links out of the tree, not followed: "
                + ", ".join(f"{path} -> {target}" for path, target in self.outside_links)
            )
        return said

    def write(self, job_dir: Path) -> Path:
        """Copy the files into ``job_dir/code`` (replacing an earlier snapshot) and list them in
        ``job_dir/code.json``; returns the code directory."""
        dest = Path(job_dir) / CODE_DIR
        staging = dest.with_name(f".{CODE_DIR}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        for rel, _ in self.files:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            _read(self.root / rel, lambda source, target=target: shutil.copy2(source, target))
        for rel, link in self.links:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(link, staging / rel)
        staging.mkdir(parents=True, exist_ok=True)  # an empty snapshot is still one
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        write_json(Path(job_dir) / CODE_FILE, self.manifest())
        return dest

    def manifest(self) -> dict[str, Any]:
        """``code.json``: the digest and every file with its size (no launcher path)."""
        return {
            "digest": self.digest,
            "size": self.size,
            "files": [{"path": p, "size": s} for p, s in self.files],
            **({"links": [{"path": p, "target": t} for p, t in self.links]} if self.links else {}),
        }

    def _too_big(self, max_bytes: int) -> str:
        biggest = sorted(self.files, key=lambda f: (-f[1], f[0]))[:5]
        listed = ", ".join(f"{path} ({_human(size)})" for path, size in biggest)
        return (
            f"the code snapshot of {self.root} is {_human(self.size)} in {len(self.files)} files, over "
            f"code.max_mb={max_bytes / 1e6:g}; the biggest: {listed}. Leave data and outputs out with a "
            f"{IGNORE_FILE} (gitignore syntax) or code.exclude=[...], or raise code.max_mb."
        )


def read_manifest(job_dir: Path) -> Mapping[str, Any] | None:
    """The job's ``code.json``, or None when the job ships no code."""
    path = Path(job_dir) / CODE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


class _Rules:
    """Which paths are left out: the fixed list, ``code.exclude``, ``.ddlkitignore``, and each
    directory's ``.gitignore`` for the paths below it."""

    def __init__(self, root: Path, exclude: Sequence[str]) -> None:
        import pathspec

        # later lines win: a `!path` in code.exclude or .ddlkitignore takes a credential file back
        self._spec = pathspec.GitIgnoreSpec.from_lines(
            [*ALWAYS_EXCLUDED, *CREDENTIALS, *exclude, *_lines(root / IGNORE_FILE)]
        )
        self._credentials = pathspec.GitIgnoreSpec.from_lines(CREDENTIALS)
        self._gitignores: dict[Path, Any] = {}
        self._pathspec = pathspec

    def credential(self, root: Path, path: Path, is_dir: bool) -> bool:
        """Whether ``path`` is one of :data:`CREDENTIALS`."""
        return self._credentials.match_file(path.relative_to(root).as_posix() + ("/" if is_dir else ""))

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


class _Walk:
    """The tree below ``root`` as the rules see it: regular files to ship, links to ship as links,
    credentials withheld, and links that leave the tree."""

    def __init__(self, root: Path, rules: _Rules, skipped: set[Path]) -> None:
        self.files: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.withheld: list[str] = []
        self.outside: list[tuple[str, str]] = []
        self._root, self._rules = root, rules
        # os.walk does not descend into linked directories: each link is looked at once, below
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            kept = []
            for d in sorted(dirnames):
                path = here / d
                # a job directory (ours or another run's) is output, not code
                if path.resolve() in skipped or (path / JOB_FILE).is_file() or self._left_out(path, True):
                    continue
                if path.is_symlink():
                    self._link(path)
                else:
                    kept.append(d)
            dirnames[:] = kept
            for name in sorted(filenames):
                path = here / name
                if self._left_out(path, False):
                    continue
                if path.is_symlink():
                    self._link(path)
                elif path.is_file():
                    self.files.append(path.relative_to(root).as_posix())

    def _left_out(self, path: Path, is_dir: bool) -> bool:
        if not self._rules.ignored(self._root, path, is_dir):
            return False
        if self._rules.credential(self._root, path, is_dir):
            self.withheld.append(path.relative_to(self._root).as_posix() + ("/" if is_dir else ""))
        return True

    def _link(self, path: Path) -> None:
        rel = path.relative_to(self._root).as_posix()
        target = Path(os.path.realpath(path))
        if target.exists() and target.is_relative_to(self._root) and target != self._root:
            self.links.append((rel, os.path.relpath(target, path.parent)))
        else:
            self.outside.append((rel, os.readlink(path)))


def _read(path: Path, read: Any) -> Any:
    """``read(path)``, with a file that cannot be read (EIO, a permission) a one-line ConfigError."""
    try:
        return read(path)
    except OSError as err:
        raise ConfigError(
            f"the code snapshot cannot read {path}: {err.strerror or err}. Leave it out with a "
            f"{IGNORE_FILE} line or code.exclude=[...], or make it readable."
        ) from None


def _digest(root: Path, files: Sequence[str], links: Sequence[tuple[str, str]] = ()) -> str:
    total = hashlib.sha256()
    for rel in files:
        total.update(rel.encode() + b"\0")
        with _read(root / rel, lambda path: open(path, "rb")) as f:
            total.update(_read(root / rel, lambda _: hashlib.file_digest(f, "sha256")).digest())
    for rel, target in links:
        total.update(rel.encode() + b"\0->" + target.encode() + b"\0")
    return total.hexdigest()


def _human(nbytes: float) -> str:
    for unit in ("B", "kB", "MB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"
