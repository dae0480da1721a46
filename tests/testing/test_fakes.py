"""The fakes behave like real components: they pass the contract suites, and the fake
framework really trains (deterministically) through ddlkit.Run."""

from __future__ import annotations

import numpy as np
import pytest

from ddlkit.interfaces import Logger, StorageBackend
from ddlkit.rank.run import Run
from ddlkit.testing import WorkerOutcome
from ddlkit.testing.contracts import FrameworkContract, LoggerContract, StorageBackendContract
from ddlkit.testing.fakes import MODEL_FILE, MemoryStorage, MemoryStorageConfig, RecordingLogger

SMALL = ("data.length=320", "data.val_length=64", "data.num_classes=10", "trainer.log_every=2")


class TestMemoryStorage(StorageBackendContract):
    @pytest.fixture
    def backend(self) -> StorageBackend:
        return MemoryStorage(MemoryStorageConfig())


class TestFakeFramework(FrameworkContract):
    framework = "fake"
    plugin = "ddlkit.testing.fakes"
    model_file = MODEL_FILE


class TestRecordingLogger(LoggerContract):
    persistent = False

    @pytest.fixture
    def logger(self) -> Logger:
        return RecordingLogger(None)

    def read_back(self, logger: Logger, run: Run) -> list[tuple[int, str]]:
        assert isinstance(logger, RecordingLogger)
        return [(c.step, c.split) for c in logger.calls if c.method == "log_metrics"]


def test_recording_logger_keeps_calls_in_order(run_inprocess) -> None:
    out: WorkerOutcome = run_inprocess(*SMALL, "logger=[recording]", "trainer.epochs=1")
    assert out.exit_code == 0
    (logger,) = out.run.loggers
    assert [c.method for c in logger.calls] == ["start"] + ["log_metrics"] * 6 + ["finish"]
    assert logger.steps("train") == [2, 4, 6, 8, 10]
    assert logger.steps("val") == [10]
    assert logger.calls[-1].status == "completed"
    assert logger.calls[-1].result["steps"] == 10


def test_fake_framework_learns(run_inprocess) -> None:
    out = run_inprocess(*SMALL, "trainer.epochs=3")
    assert out.exit_code == 0
    losses = [m["loss"] for m in out.metrics if m["split"] == "train"]
    assert len(losses) == 15
    assert losses[-1] < losses[0] / 3, losses  # it memorises the synthetic batch
    assert out.result["final_loss"] == losses[-1]


def test_fake_framework_is_deterministic(run_inprocess) -> None:
    a = run_inprocess(*SMALL)
    b = run_inprocess(*SMALL)
    assert (a.job_dir / MODEL_FILE).read_bytes() == (b.job_dir / MODEL_FILE).read_bytes()
    assert np.load(a.job_dir / MODEL_FILE).shape == (3 * 4 * 4 + 1, 10)


def test_fake_framework_validates_its_config(run_inprocess) -> None:
    from ddlkit import ConfigError

    with pytest.raises(ConfigError, match=r"framework.side=0 is invalid"):
        run_inprocess("framework.side=0")


def test_fake_framework_checkpoint_holds_weights_momentum_and_meta(run_inprocess) -> None:
    out = run_inprocess(*SMALL, "trainer.epochs=1")
    ckpt_dir = out.job_dir / "checkpoints"
    latest = ckpt_dir / (ckpt_dir / "latest").read_text().strip()
    with np.load(latest, allow_pickle=False) as ckpt:
        assert sorted(ckpt.files) == ["meta", "theta", "velocity"]
        assert np.array_equal(ckpt["theta"], np.load(out.job_dir / MODEL_FILE))
        assert np.abs(ckpt["velocity"]).sum() > 0
        assert '"step": 10' in str(ckpt["meta"])
