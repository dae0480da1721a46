"""Checks for tests of elastic jobs (``compute.min_nodes``) that lose nodes, restart on fewer and
grow back: that nothing was lost -- each epoch trained every sample exactly once, counting only the
steps that stand (:func:`ddlkit.testing.multirank.worker_pids` reaches a running job's ranks, to
stop one as a scheduler would). The samples are those ``framework=fake`` traced (``framework.trace_samples=true``) from
``data=custom data.target=ddlkit.testing.fakes:class_images +data.kwargs.numbered=true``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..jobdir import SUBMISSION_FILE
from .fakes import TRACE_DIR


def restarts(job_dir: Path) -> list[dict]:
    """The job's restarts as its record keeps them (``ddlkit jobs status``)."""
    return json.loads((Path(job_dir) / SUBMISSION_FILE).read_text())["restarts"]


def trained_samples(job_dir: Path, trace_dir: Path | None = None) -> dict[int, Counter]:
    """How often each sample was trained on, per epoch, counting only the steps that stand: a run's
    steps after the checkpoint that the next run resumed from were trained again there. ``trace_dir``:
    where the ranks traced (``framework.trace_dir``; None: the job directory's ``trace/``)."""
    cutoff = [entry["resumed_from"] for entry in restarts(job_dir)]
    seen: dict[int, Counter] = {}
    for path in Path(trace_dir or Path(job_dir) / TRACE_DIR).glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            step = json.loads(line)
            if step["run"] < len(cutoff) and step["step"] > cutoff[step["run"]]:
                continue
            seen.setdefault(step["epoch"], Counter()).update(step["samples"])
    return seen


def assert_every_sample_once(job_dir: Path, *, epochs: int, samples: int, trace_dir: Path | None = None) -> None:
    """Each of ``epochs`` epochs trained each of ``samples`` samples exactly once."""
    seen = trained_samples(job_dir, trace_dir)
    assert sorted(seen) == list(range(epochs)), f"epochs trained: {sorted(seen)}"
    for epoch, counts in sorted(seen.items()):
        skipped = sorted(set(range(samples)) - set(counts))
        twice = sorted(s for s, c in counts.items() if c > 1)
        assert not skipped and not twice, f"epoch {epoch}: samples skipped {skipped}, seen more than once {twice}"
