"""Moving datasets and results between storage and this machine.

* :func:`open_storage` turns a path or a URL (``blob://container/prefix``) into a
  :class:`~ddlkit.StorageBackend` whose keys are relative to it; URL schemes are looked up among
  the registered storage backends (:attr:`StorageBackend.url_schemes`), so the core never
  imports a cloud SDK.
* :func:`stage` copies a dataset described by its ``manifest.tsv`` into a local directory:
  in parallel, each file hash-verified before it is renamed into place (so whatever is present
  is complete), resumable after an interruption, and a no-op (0 bytes) when the copy already
  matches the manifest, which is how later jobs on the same node reuse it.
* :func:`publish_job` copies a job's results, with retries, ``result.json`` last, so that a
  result.json at the destination means everything before it arrived.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from ..errors import ConfigError, RunError
from ..interfaces import StorageBackend
from ..jobdir import OUTPUT_GLOBS, RESULT_FILE, RESULT_FILES, STATE_DIR
from ._manifest import MANIFEST_NAME, Entry, Manifest, sha256_file

T = TypeVar("T")

#: the job-directory files published before the checkpoints (and result.json, always last)
RESULT_GLOBS = (*(name for name in RESULT_FILES if name != RESULT_FILE), *OUTPUT_GLOBS)


class TransientStorageError(OSError):
    """A storage operation failed in a way that may succeed when retried (timeouts, throttling,
    5xx answers). Backends raise it so that :func:`retry` knows what to try again."""


# ---------------------------------------------------------------------------- URLs
def is_url(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def split_url(url: str) -> tuple[str, str, str]:
    """``blob://container/a/b`` -> ``("blob", "container", "a/b")``."""
    scheme, _, rest = url.partition("://")
    container, _, prefix = rest.strip("/").partition("/")
    if not container:
        raise ConfigError(f"{url!r} names no container: write {scheme}://<container>[/<prefix>]")
    return scheme, container, prefix.strip("/")


def open_storage(location: str) -> StorageBackend:
    """A backend whose keys are relative to ``location``: a directory, or a URL one of the
    installed storage backends opens (``blob://`` needs ``pip install ddlkit-azure``)."""
    from ..plugins import get_plugin_manager
    from ..registry import Registry

    registry = Registry.collect(get_plugin_manager())
    if not is_url(location):
        # a directory: storage=local, found as every backend is (the SDK names no built-in)
        local = registry.get("storage", "local")
        return local.factory(local.config(root=str(Path(location.removeprefix("file://")).expanduser())))
    scheme = location.split("://", 1)[0]
    for name in registry.names("storage"):
        factory = registry.get("storage", name).factory
        if scheme in getattr(factory, "url_schemes", ()):
            return factory.from_url(location)
    hint = " Install the Azure plugin: pip install ddlkit-azure." if scheme == "blob" else ""
    raise ConfigError(f"no installed storage backend opens {scheme}:// URLs ({location}).{hint}")


# ---------------------------------------------------------------------------- retries and progress
#: seconds a small request (one that moves no file: a listing, a write check) may go unanswered
#: before :func:`retry` says that it waits
WAIT_NOTICE_S = 8.0


def retry(fn: Callable[[], T], *, what: str, attempts: int = 5, base_delay_s: float = 0.5,
          small: bool = False) -> T:
    """Call ``fn`` until it succeeds, retrying :class:`TransientStorageError` (and other OSErrors
    but "not found") with exponential backoff; the last error propagates, naming ``what``.

    Each retry is announced on stderr with its delay, and with ``small`` (``fn`` moves no file, so
    a working endpoint answers it in a second) an attempt unanswered for :data:`WAIT_NOTICE_S`
    says so: a storage account that stopped answering shows up as lines within seconds, not as
    silence until a read times out. Backends keep their own SDK's retries off and bound each
    attempt (connect/read timeouts), so the worst case is ``attempts`` bounded attempts plus
    ``base_delay_s * (2**(attempts-1) - 1)`` seconds of waiting."""
    for attempt in range(1, attempts + 1):
        notice = threading.Timer(WAIT_NOTICE_S, lambda attempt=attempt: print(
            f"ddlkit: {what}: no answer for {WAIT_NOTICE_S:g} s; still waiting (attempt {attempt} of {attempts})",
            file=sys.stderr, flush=True))
        notice.daemon = True
        if small:
            notice.start()
        try:
            return fn()
        except FileNotFoundError:
            raise
        except OSError as err:
            error = err
        finally:
            notice.cancel()
        if attempt == attempts:
            raise RunError(f"{what} failed after {attempts} attempts: {error}", component="storage") from error
        delay = base_delay_s * 2 ** (attempt - 1)
        print(f"ddlkit: {what} failed ({error}); retrying in {delay:g} s (attempt {attempt + 1} of {attempts})",
              file=sys.stderr, flush=True)
        time.sleep(delay)
    raise AssertionError("unreachable")


class Progress:
    """Counts bytes done out of a total: a live bar on a terminal, a line every 10 % otherwise."""

    def __init__(self, description: str, total_bytes: int, *, live: bool | None = None) -> None:
        self.description, self.total, self.done = description, total_bytes, 0
        self._lock = threading.Lock()
        self._next_report = 0.1
        self._bar = None
        if live if live is not None else sys.stderr.isatty():
            from rich.progress import (BarColumn, DownloadColumn, Progress as Bar, TimeRemainingColumn,
                                       TransferSpeedColumn)

            self._bar = Bar("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), TimeRemainingColumn(), transient=False)
            self._task = self._bar.add_task(description, total=total_bytes)
            self._bar.start()

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                self._bar.update(self._task, advance=nbytes)
            elif self.total and self.done / self.total >= self._next_report:
                self._next_report = int(self.done / self.total * 10) / 10 + 0.1
                print(f"ddlkit: {self.description}: {_gb(self.done)} of {_gb(self.total)} "
                      f"({100 * self.done / self.total:.0f}%)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def parallel(fn: Callable[[T], None], items: Sequence[T], workers: int) -> None:
    """Run ``fn`` on every item with ``workers`` threads; the first error cancels what has not
    started and propagates."""
    if not items:
        return
    with ThreadPoolExecutor(max(1, min(workers, len(items)))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


# ---------------------------------------------------------------------------- staging
@dataclass
class StagingReport:
    """What one staging did; written to the job directory as ``staging-node<N>.json``."""

    source: str
    destination: str
    files: int
    bytes: int
    files_transferred: int
    bytes_transferred: int
    seconds: float
    #: the copy already matched the manifest: nothing was transferred
    reused: bool

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


@contextlib.contextmanager
def _node_lock(path: Path, what: str) -> Iterator[None]:
    """One stager per copy on this node: concurrent jobs (a sweep) wait for the first, then
    find the copy complete."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"ddlkit: waiting for another job on this node that is staging {what}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_staged(dest: Path) -> bool:
    return (dest / STATE_DIR / "complete").is_file() and (dest / MANIFEST_NAME).is_file()


def stage(source: StorageBackend, dest: Path, *, describe: str, workers: int = 16, verify: str = "size",
          reserve_bytes: int = 0, attempts: int = 5, live: bool | None = None) -> StagingReport:
    """Make ``dest`` an exact copy of the dataset in ``source`` (keys relative to its root), as
    listed by the source's ``manifest.tsv``.

    A file already in ``dest`` counts as staged when its size matches the manifest (``verify=size``;
    every file was hash-checked before it was renamed into place) or its hash does (``verify=hash``).
    Refuses to start, with the sizes, when the disk holding ``dest`` lacks room for what is missing
    plus ``reserve_bytes``.
    """
    t0 = time.perf_counter()
    dest = Path(dest)
    state = dest / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    with _node_lock(state / "lock", describe):
        tmp = state / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # partial downloads of an interrupted staging
        tmp.mkdir()
        new_manifest = tmp / MANIFEST_NAME
        try:
            retry(lambda: source.get(MANIFEST_NAME, new_manifest), what=f"reading {describe}/{MANIFEST_NAME}",
                  attempts=attempts)
        except FileNotFoundError:
            raise ConfigError(f"{describe} has no {MANIFEST_NAME}, so it cannot be staged and verified. Write one "
                              f"with `ddlkit data manifest ROOT` (or upload with `ddlkit data upload`, which adds "
                              f"it).") from None
        manifest = Manifest.read(new_manifest)
        previous = state / MANIFEST_NAME
        if previous.is_file():
            # a file whose content changed since the last staging must not pass the size check
            old = Manifest.read(previous).by_path
            for e in manifest.entries:
                if e.path in old and old[e.path].sha256 != e.sha256:
                    (dest / e.path).unlink(missing_ok=True)
        os.replace(new_manifest, previous)
        todo = [e for e in manifest.entries if not _present(dest / e.path, e, verify)]
        if not todo and is_staged(dest):
            return StagingReport(describe, str(dest), len(manifest), manifest.total_bytes, 0, 0,
                                 time.perf_counter() - t0, reused=True)
        (state / "complete").unlink(missing_ok=True)
        needed = sum(e.size for e in todo)
        free = shutil.disk_usage(dest).free
        if needed + reserve_bytes > free:
            raise ConfigError(
                f"not enough space to stage {describe} into {dest}: {_gb(needed)} still to copy"
                f"{f' plus a reserve of {_gb(reserve_bytes)}' if reserve_bytes else ''}, but only {_gb(free)} free "
                f"(the dataset is {_gb(manifest.total_bytes)}, {_gb(manifest.total_bytes - needed)} already staged). "
                "Free space there, point storage.scratch at a larger disk, or read the data in place with "
                "storage=nfs.")
        progress = Progress(f"staging {describe}", needed, live=live)

        def fetch(entry: Entry) -> None:
            final = dest / entry.path
            for _ in range(attempts):
                part = tmp / uuid.uuid4().hex
                retry(lambda part=part: source.get(entry.path, part), what=f"downloading {describe}/{entry.path}",
                      attempts=attempts)
                if part.stat().st_size == entry.size and sha256_file(part) == entry.sha256:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(part, final)
                    progress.advance(entry.size)
                    return
                part.unlink()
            raise RunError(f"{describe}/{entry.path} does not match its manifest entry (size {entry.size}, sha256 "
                           f"{entry.sha256[:12]}...) after {attempts} downloads: the source changed after the "
                           "manifest was written. Rewrite it with `ddlkit data manifest` (or re-upload).",
                           component="storage")

        try:
            parallel(fetch, todo, workers)
        finally:
            progress.close()
        shutil.copyfile(state / MANIFEST_NAME, tmp / MANIFEST_NAME)
        os.replace(tmp / MANIFEST_NAME, dest / MANIFEST_NAME)
        (state / "complete").write_text(manifest.digest + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
        return StagingReport(describe, str(dest), len(manifest), manifest.total_bytes, len(todo), needed,
                             time.perf_counter() - t0, reused=False)


def _present(path: Path, entry: Entry, verify: str) -> bool:
    try:
        if path.stat().st_size != entry.size:
            return False
    except FileNotFoundError:
        return False
    return verify != "hash" or sha256_file(path) == entry.sha256


# ---------------------------------------------------------------------------- results
class CheckpointPublisher(ABC):
    """A storage backend that copies each checkpoint to its results location as soon as it is
    written, when its config says ``upload_checkpoints: true``."""

    @abstractmethod
    def publish_checkpoint(self, job_dir: Path, job_name: str, files: list[str]) -> None:
        """Copy ``files`` (relative to ``job_dir``; the checkpoint, then ``checkpoints/latest``)."""


def result_files(job_dir: Path, *, checkpoints: bool) -> list[str]:
    """Relative paths of the job's results; ``result.json`` (when present) last."""
    from ..checkpoint import CHECKPOINT_DIR, LATEST, latest_checkpoint

    found = sorted({p.relative_to(job_dir).as_posix() for g in RESULT_GLOBS for p in job_dir.glob(g) if p.is_file()})
    if checkpoints:
        latest = latest_checkpoint(job_dir)
        if latest is not None:
            found += checkpoint_files(job_dir, latest) + [f"{CHECKPOINT_DIR}/{LATEST}"]
    if (job_dir / RESULT_FILE).is_file():
        found.append(RESULT_FILE)
    return found


def checkpoint_files(job_dir: Path, checkpoint: Path) -> list[str]:
    """A checkpoint's files (it is a file, or a directory the framework wrote), then its manifest if it has one."""
    from ..checkpoint import manifest_path

    files = [checkpoint] if checkpoint.is_file() else sorted(p for p in checkpoint.rglob("*") if p.is_file())
    if manifest_path(checkpoint).is_file():
        files.append(manifest_path(checkpoint))
    return [p.relative_to(job_dir).as_posix() for p in files]


def publish_files(job_dir: Path, files: Sequence[str], dest: StorageBackend, prefix: str, *, attempts: int = 5,
                  workers: int = 4) -> None:
    """Copy ``files`` (relative to ``job_dir``) to ``dest`` under ``prefix``: all but the last in
    parallel, then the last, so that the last one's presence means the others arrived."""
    if not files:
        return
    prefix = prefix.strip("/")

    def put(rel: str) -> None:
        key = f"{prefix}/{rel}" if prefix else rel
        retry(lambda: dest.put(job_dir / rel, key), what=f"uploading {rel} to {key}", attempts=attempts)

    parallel(put, list(files[:-1]), workers)
    put(files[-1])
