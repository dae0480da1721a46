"""logger=tensorboard against the test kit's LoggerContract, its records read back as TensorBoard
reads them (EventAccumulator, which drops what a resumed run's purge marker says to)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ddlkit import Logger, Run
from ddlkit.testing.contracts import LoggerContract
from ddlkit_tensorboard.logger import TensorboardConfig, TensorboardLogger

# TensorBoard's reader loads TensorFlow (seconds, once per session)
pytestmark = pytest.mark.slow


class TestTensorboardLogger(LoggerContract):
    @pytest.fixture(autouse=True)
    def _reader(self, event_accumulator: type) -> None:
        self.event_accumulator = event_accumulator

    @pytest.fixture
    def logger(self) -> Logger:
        return TensorboardLogger(OmegaConf.structured(TensorboardConfig()))

    def read_back(self, logger: Logger, run: Run) -> list[tuple[int, str]]:
        acc = self.event_accumulator(str(Path(run.job_dir) / TensorboardConfig().subdir))
        acc.Reload()
        tags = acc.Tags()["scalars"]
        # TensorBoard keeps each tag's points by step: a train record is its point of train/loss
        # (every train record has a loss), a validation record its point of val/val_loss
        kept = [
            (event.step, split)
            for split, tag in (("train", "train/loss"), ("val", "val/val_loss"))
            if tag in tags
            for event in acc.Scalars(tag)
        ]
        return sorted(kept, key=lambda record: (record[0], record[1] == "val"))
