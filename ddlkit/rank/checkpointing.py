"""The run's checkpoint files: rank 0 writes each one atomically with its manifest, moves the
``latest`` pointer and drops the oldest beyond ``trainer.keep_checkpoints``, keeps the best
apart; a full disk is reported with what is still intact. The files a framework saves beside
them (``run.save_artifact``: the final model) are written under the same rules. Resuming loads
the checkpoint a job resumes from and refuses one of another framework or model.

What a checkpoint holds of the run (its state, its watchers) is the :class:`~ddlkit.rank.run.Run`'s
to say; this module keeps the files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..atomic import atomic_path
from ..checkpoint import (BEST, CHECKPOINT_DIR, build_manifest, checkpoint_name, keep_best, mark_latest, no_space,
                          read_manifest, remove_stale, verify, write_manifest)
from ..errors import ConfigError, DdlkitError, RunError
from ..interfaces import RunState
from ..interfaces.run import LoadFn, SaveFn


class CheckpointKeeper:
    """The checkpoints (and artifacts) of one job directory, as one rank sees them: only the
    writer (rank 0) writes; every rank loads the one it resumes from."""

    def __init__(self, job_dir: Path, *, keep: int, writer: bool, resume_from: Path | None) -> None:
        self.job_dir = job_dir
        self.directory = job_dir / CHECKPOINT_DIR
        #: trainer.keep_checkpoints: how many step checkpoints stay
        self.keep = keep
        #: whether this rank writes (rank 0)
        self.writer = writer
        #: the framework's ``save``, from Run.checkpointing() on
        self.save: SaveFn | None = None
        #: the newest complete checkpoint of this job (the one resumed from, then each one written)
        self.latest: Path | None = resume_from
        #: (step, epoch) of the newest checkpoint: the state resumed from, then each one written
        self.saved_at: tuple[int, int] | None = None

    def remove_stale(self) -> None:
        """Remove what a run killed mid-checkpoint left (nothing else writes here: the job is starting)."""
        if not self.writer:
            return
        stale = remove_stale(self.directory)
        if stale:
            print(f"ddlkit: removed {len(stale)} stale temporary file(s) of an interrupted checkpoint write from "
                  f"{self.directory}: {', '.join(sorted(p.name for p in stale))}", flush=True)

    def load(self, load: LoadFn, path: Path) -> dict[str, Any]:
        """The ``meta`` of checkpoint ``path`` as the framework's ``load`` reads it back."""
        try:
            return load(path)
        except DdlkitError:
            raise
        except Exception as err:
            # resolve_resume verified it against its manifest if it has one: what fails here is a
            # checkpoint without one (an older ddlkit's, or one given by path), or another version's
            why = ("it matches its manifest, so it was written by an incompatible version or settings"
                   if read_manifest(path) is not None else "it has no manifest to verify it against")
            raise RunError(
                f"cannot load checkpoint {path} ({type(err).__name__}: {str(err).strip()[:300]}); {why}. Resume from "
                "another checkpoint with trainer.resume=<path>, or start fresh with trainer.resume=false.",
                component="framework") from err

    def is_due(self, state: RunState) -> bool:
        """Whether this rank writes a checkpoint of ``state`` now: it is the writer, the framework
        said how, and no checkpoint holds this point yet."""
        return self.save is not None and self.writer and self.saved_at != (state.step, state.epoch)

    def holds(self, state: RunState) -> bool:
        """Whether the newest checkpoint is of ``state``."""
        return self.saved_at == (state.step, state.epoch)

    def write(self, state: RunState, meta: dict[str, Any]) -> Path:
        """Write a checkpoint of ``state`` with ``meta``, then make it the latest (see :meth:`is_due`)."""
        assert self.save is not None, "Run.checkpointing() registers save before any checkpoint is due"
        save = self.save
        path = self.directory / checkpoint_name(state.step)

        def out_of_space(reason: str) -> RunError:
            return self._out_of_space(reason, state.step)

        with _explained_if_full(self.directory, out_of_space, only=OSError, slack=0):  # fsync, a rename, the pointer
            with atomic_path(path) as tmp:
                with _explained_if_full(tmp.parent, out_of_space):
                    save(tmp, meta)
                    # hashed from the bytes just written (still in the page cache), and in place
                    # before the checkpoint is: a checkpoint of this version always has its manifest
                    # with the run's position, which a run on another world size reads before it
                    # builds its loaders (ddlkit.resize), without the framework's load
                    write_manifest(path, {**build_manifest(tmp), "position": position(meta)})
            mark_latest(path, keep=self.keep)
        self.saved_at = (state.step, state.epoch)
        self.latest = path
        return path

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
            kept = (f"the previous checkpoint {prev} is intact{size}: free space, then run the same command to "
                    "resume from it")
        return RunError(f"{where}; {kept}", component="checkpoint", step=step)

    def keep_best(self) -> None:
        """Keep the newest checkpoint also as ``checkpoints/best.ckpt`` (the writer only)."""
        if self.writer and self.latest is not None:
            keep_best(self.latest, self.directory / BEST)

    def write_artifact(self, name: str, write: Callable[[Path], None]) -> Path | None:
        """Write a file such as the final model into the job directory atomically (the writer only)."""
        if not self.writer:
            return None
        path = self.job_dir / name

        def out_of_space(reason: str) -> RunError:
            return RunError(f"{reason} on {self.job_dir} while writing {name}; the latest checkpoint {self.latest} "
                            "is intact", component="storage")

        with _explained_if_full(self.job_dir, out_of_space, only=OSError, slack=0):  # the fsync or the rename
            with atomic_path(path) as tmp:
                with _explained_if_full(tmp.parent, out_of_space):
                    write(tmp)
        return path


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
def _explained_if_full(directory: Path, explain: Callable[[str], RunError], *,
                       only: type[BaseException] = Exception, **no_space_options: int) -> Iterator[None]:
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
