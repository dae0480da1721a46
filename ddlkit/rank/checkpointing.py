"""The run's checkpoint files: rank 0 writes each one atomically with its manifest, moves the
``latest`` pointer and drops the oldest beyond ``trainer.keep_checkpoints``, keeps the best
apart; a full disk is reported with what is still intact. A sharded checkpoint (``dist=fsdp``)
is a directory every rank writes its part of, into a temporary directory all ranks name alike;
once the framework's collective save has returned, every part is there and rank 0 completes it
as any other: manifest first, then the rename, then the pointer. Where the framework can copy its state
(a ``snapshot``), a checkpoint in the middle of training is written in the background: the
training thread pays for the copy only, and the write, its checksum and the fsync run on a thread
while the next steps do (one write at a time; its error surfaces at the next step). The files a
framework saves beside them (``run.save_artifact``: the final model) are written under the same
rules. Resuming loads the checkpoint a job resumes from and refuses one of another framework or
model.

What a checkpoint holds of the run (its state, its watchers) is the :class:`~ddlkit.rank.run.Run`'s
to say; this module keeps the files.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..atomic import atomic_path, put_in_place, temporary_sibling
from ..checkpoint import (
    BEST,
    CHECKPOINT_DIR,
    build_manifest,
    checkpoint_name,
    keep_best,
    mark_latest,
    no_space,
    read_manifest,
    remove_stale,
    verify,
    write_manifest,
)
from ..errors import ConfigError, DdlkitError, RunError
from ..interfaces import RunState
from ..interfaces.run import LoadFn, SaveFn, SnapshotFn


class CheckpointKeeper:
    """The checkpoints (and artifacts) of one job directory, as one rank sees them: only the
    writer (rank 0) writes; every rank loads the one it resumes from."""

    def __init__(
        self, job_dir: Path, *, keep: int, writer: bool, resume_from: Path | None, checksum: str = "crc32"
    ) -> None:
        self.job_dir = job_dir
        self.directory = job_dir / CHECKPOINT_DIR
        #: trainer.keep_checkpoints: how many step checkpoints stay
        self.keep = keep
        #: trainer.checkpoint_checksum: what the manifests keep of each file
        self.checksum = checksum
        #: whether this rank completes checkpoints and writes artifacts (rank 0)
        self.writer = writer
        #: every rank writes its part of each checkpoint (Run.checkpointing(sharded=True))
        self.sharded = False
        #: the framework's ``save``, from Run.checkpointing() on
        self.save: SaveFn | None = None
        #: the newest complete checkpoint of this job (the one resumed from, then each one written)
        self.latest: Path | None = resume_from
        #: (step, epoch) of the newest checkpoint: the state resumed from, then each one written
        #: (or being written in the background)
        self.saved_at: tuple[int, int] | None = None
        #: the framework's ``snapshot``, if it has one: checkpoints may then be written in the background
        self.snapshot: SnapshotFn | None = None
        #: called on the training thread with (path, step) once a checkpoint is complete
        self.on_written: Callable[[Path, int], None] = lambda path, step: None
        #: seconds each checkpoint taken while training goes on held the training thread: the copy of
        #: the state where it is written in the background, the whole write where not (result.json's
        #: checkpoint_stall_s)
        self.stalls: list[float] = []
        self._in_flight: _InFlight | None = None

    def remove_stale(self) -> None:
        """Remove what a run killed mid-checkpoint left (nothing else writes here: the job is starting)."""
        if not self.writer:
            return
        stale = remove_stale(self.directory)
        if stale:
            print(
                f"ddlkit: removed {len(stale)} stale temporary file(s) of an interrupted checkpoint write from "
                f"{self.directory}: {', '.join(sorted(p.name for p in stale))}",
                flush=True,
            )

    def load(self, load: LoadFn, path: Path) -> dict[str, Any]:
        """The ``meta`` of checkpoint ``path`` as the framework's ``load`` reads it back."""
        try:
            return load(path)
        except DdlkitError:
            raise
        except Exception as err:
            # resolve_resume verified it against its manifest if it has one: what fails here is a
            # checkpoint without one (an older ddlkit's, or one given by path), or another version's
            why = (
                "it matches its manifest, so it was written by an incompatible version or settings"
                if read_manifest(path) is not None
                else "it has no manifest to verify it against"
            )
            raise RunError(
                f"cannot load checkpoint {path} ({type(err).__name__}: {str(err).strip()[:300]}); {why}. Resume from "
                "another checkpoint with trainer.resume=<path>, or start fresh with trainer.resume=false.",
                component="framework",
            ) from err

    def is_due(self, state: RunState) -> bool:
        """Whether this rank writes a checkpoint of ``state`` now: it is the writer (or every rank
        writes its part), the framework said how, and no checkpoint holds this point yet."""
        writes = self.writer or self.sharded
        return self.save is not None and writes and self.saved_at != (state.step, state.epoch)

    def holds(self, state: RunState) -> bool:
        """Whether the newest checkpoint is of ``state``."""
        return self.saved_at == (state.step, state.epoch)

    def write(self, state: RunState, meta: dict[str, Any], *, background: bool = False) -> None:
        """Write a checkpoint of ``state`` with ``meta``, then make it the latest (see :meth:`is_due`).

        With ``background`` and a framework ``snapshot``, only the copy of the state is taken here;
        the rest runs on a thread, and :meth:`poll` or :meth:`wait` completes it. A write still in
        the background is completed first: one at a time, in order."""
        assert self.save is not None, "Run.checkpointing() registers save before any checkpoint is due"
        start = time.perf_counter()
        self.wait()
        path = self.directory / checkpoint_name(state.step)
        if background and self.snapshot is not None:
            writer = self.snapshot(meta)
            self._in_flight = _InFlight(path, state.step, lambda: self._write(path, state.step, writer, meta))
        else:
            save = self.save
            self._write(path, state.step, lambda tmp: save(tmp, meta), meta)
            self._written(path, state.step)
        self.saved_at = (state.step, state.epoch)
        if background:  # the job goes on training (the last checkpoint and a stop's are not asked in the background)
            self.stalls.append(time.perf_counter() - start)

    def stall_summary(self) -> dict[str, Any] | None:
        """result.json's ``checkpoint_stall_s``: how long the checkpoints taken while training went
        on held the training thread (median, max and total seconds), and whether they were written in
        the background; None if there was none."""
        if not self.stalls:
            return None
        return {
            "checkpoints": len(self.stalls),
            "background": self.snapshot is not None,
            "median": round(statistics.median(self.stalls), 3),
            "max": round(max(self.stalls), 3),
            "total": round(sum(self.stalls), 3),
        }

    def _write(self, path: Path, step: int, write: Callable[[Path], None], meta: dict[str, Any]) -> None:
        """Write checkpoint ``path`` with ``write``, its manifest, and move the pointer."""

        def out_of_space(reason: str) -> RunError:
            return self._out_of_space(reason, step)

        def manifest(tmp: Path) -> None:
            # hashed from the bytes just written (still in the page cache), and in place before
            # the checkpoint is: a checkpoint of this version always has its manifest with the
            # run's position, which a run on another world size reads before it builds its
            # loaders (ddlkit.resize), without the framework's load
            write_manifest(path, {**build_manifest(tmp, self.checksum), "position": position(meta)})

        if self.sharded:
            self._write_sharded(path, write, manifest, out_of_space)
            return
        with _explained_if_full(self.directory, out_of_space, only=OSError, slack=0):  # fsync, a rename, the pointer
            with atomic_path(path) as tmp:
                with _explained_if_full(tmp.parent, out_of_space):
                    write(tmp)
                    manifest(tmp)
            mark_latest(path, keep=self.keep)

    def _write_sharded(
        self,
        path: Path,
        write: Callable[[Path], None],
        manifest: Callable[[Path], None],
        out_of_space: Callable[[str], RunError],
    ) -> None:
        """Every rank writes its part into the temporary directory all ranks name alike; the
        framework's ``write`` returns on each rank once all parts are written, and rank 0 then
        completes the checkpoint. A rank whose part fails raises, and the job ends with the
        previous checkpoint the latest (the next start removes the partial directory)."""
        tmp = temporary_sibling(path, "shards")
        with _explained_if_full(self.directory, out_of_space):
            write(tmp)
        if not self.writer:
            return
        with _explained_if_full(self.directory, out_of_space, only=OSError, slack=0):
            manifest(tmp)
            put_in_place(tmp, path)
            tmp.parent.rmdir()
            mark_latest(path, keep=self.keep)

    def _written(self, path: Path, step: int) -> None:
        self.latest = path
        self.on_written(path, step)

    def poll(self) -> None:
        """Complete the checkpoint written in the background if its thread is done (raising its
        error if it failed); never waits."""
        if self._in_flight is not None and self._in_flight.done():
            self.wait()

    def wait(self) -> None:
        """Wait for the checkpoint being written in the background, if any, and complete it; its
        error, if it failed, is raised here (the previous checkpoint stays the latest)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        in_flight.join()
        if in_flight.error is not None:
            err = in_flight.error
            if isinstance(err, DdlkitError):
                raise err
            raise RunError(
                f"writing checkpoint step {in_flight.step} in the background failed "
                f"({type(err).__name__}: {str(err).strip()[:300]}); the previous checkpoint {self.latest} "
                "is the latest",
                component="checkpoint",
                step=in_flight.step,
            ) from err
        self._written(in_flight.path, in_flight.step)

    def _out_of_space(self, reason: str, step: int) -> RunError:
        """The error for a checkpoint that did not fit: what is kept, and how to go on."""
        where = f"{reason} on {self.directory} while writing checkpoint step {step}"
        prev = self.latest
        if prev is None:
            kept = "no earlier checkpoint exists, so a new run starts from step 0"
        elif (problem := verify(prev, hashes=False)) is not None:
            kept = f"the previous checkpoint {prev} is damaged too ({problem})"
        else:
            manifest = read_manifest(prev)
            size = f" ({manifest['bytes'] / 2**20:.1f} MiB; the next one needs as much)" if manifest else ""
            kept = (
                f"the previous checkpoint {prev} is intact{size}: free space, then run the same command to "
                "resume from it"
            )
        return RunError(f"{where}; {kept}", component="checkpoint", step=step)

    def keep_best(self) -> None:
        """Keep the newest checkpoint also as ``checkpoints/best.ckpt`` (the writer only)."""
        self.wait()
        if self.writer and self.latest is not None:
            keep_best(self.latest, self.directory / BEST)

    def write_artifact(self, name: str, write: Callable[[Path], None]) -> Path | None:
        """Write a file such as the final model into the job directory atomically (the writer only)."""
        if not self.writer:
            return None
        path = self.job_dir / name

        def out_of_space(reason: str) -> RunError:
            return RunError(
                f"{reason} on {self.job_dir} while writing {name}; the latest checkpoint {self.latest} is intact",
                component="storage",
            )

        with _explained_if_full(self.job_dir, out_of_space, only=OSError, slack=0):  # the fsync or the rename
            with atomic_path(path) as tmp:
                with _explained_if_full(tmp.parent, out_of_space):
                    write(tmp)
        return path


class _InFlight:
    """A checkpoint being written on a thread of its own. A daemon thread: a process that ends
    without waiting for it (SIGKILL cannot be waited for anyway) leaves temporaries behind, which
    the next start removes (:func:`ddlkit.checkpoint.remove_stale`), never a checkpoint half-written."""

    def __init__(self, path: Path, step: int, work: Callable[[], None]) -> None:
        self.path, self.step = path, step
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name=f"ddlkit checkpoint {step}", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as err:  # raised on the training thread by CheckpointKeeper.wait
            self.error = err

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()


def position(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Where a checkpoint stands in the data: its state and the global batch its steps counted."""
    return {"state": meta["state"], "global_batch_size": meta["global_batch_size"]}


def saved_position(checkpoint: Path | None) -> dict[str, Any] | None:
    """:func:`position` of ``checkpoint`` as its manifest keeps it; None without one (an older
    checkpoint's manifest has none: its global batch is then read from its meta on load)."""
    if checkpoint is None:
        return None
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError):
        return None
    return (manifest or {}).get("position")


def check_compatible(meta: Mapping[str, Any], path: Path | None, **mine: str) -> None:
    """Refuse checkpoint ``path``, whose ``meta`` this is, unless it was written with the same
    settings as ``mine`` (``framework=``, ``model=``): its state would not fit this run."""
    for key, value in mine.items():
        theirs = meta.get(key)
        if theirs is not None and theirs != value:
            raise ConfigError(
                f"checkpoint {path} was written with {key}={theirs}, this run has {key}={value}. "
                "Use the same setting, or start fresh with trainer.resume=false (or another hydra.run.dir)."
            )


@contextmanager
def _explained_if_full(
    directory: Path,
    explain: Callable[[str], RunError],
    *,
    only: type[BaseException] = Exception,
    **no_space_options: int,
) -> Iterator[None]:
    """Raise ``explain(reason)`` in place of an error of type ``only`` that a full file system
    under ``directory`` caused (see :func:`ddlkit.checkpoint.no_space`); around a write, ask
    before the partial write is removed and frees its space."""
    try:
        yield
    except only as err:
        full = no_space(err, directory, **no_space_options)
        if full:
            raise explain(full) from err
        raise
