"""Loggers: where metrics go. Called on rank 0 only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .run import RunContext


class Logger:
    """Receives the metrics of a run. Every method has a no-op default: override what you need.

    A run may have several loggers (``logger=[console,jsonl]``); all of them are called on
    rank 0 only, so a logger never sees duplicate metrics from other ranks.
    """

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def configure(self, config: DictConfig) -> None:
        """Validate this logger's options against the whole composed ``config`` in the launcher,
        before anything runs; raise ConfigError. Called for the selected loggers only (the
        launcher builds them for it: a constructor does no I/O)."""

    def start(self, run: RunContext) -> None:
        """The run starts (or resumes); ``run.state`` holds the step it resumes from."""

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: Literal["train", "val"]) -> None:
        """Metrics at a logging step (``split="train"``) or after an epoch's validation (``"val"``)."""

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        """Always called, also when the run fails; ``result`` is result.json when completed."""
