"""logger=jsonl: the logger contract, plus metrics.jsonl across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit import Logger
from ddlkit.builtin.jsonl_logger import JsonlLogger, JsonlLoggerConfig
from ddlkit.rank.run import Run
from ddlkit.testing.contracts import LoggerContract


class TestJsonlLogger(LoggerContract):
    @pytest.fixture
    def logger(self) -> Logger:
        return JsonlLogger(JsonlLoggerConfig())

    def read_back(self, logger: Logger, run: Run) -> list[tuple[int, str]]:
        lines = (run.job_dir / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["split"]) for r in map(json.loads, lines)]


SMALL = ("data.length=320", "data.val_length=64", "data.num_classes=10", "trainer.log_every=2", "logger=[jsonl]")


def test_a_record_per_logging_step_and_validation(run_inprocess) -> None:
    records = run_inprocess(*SMALL).metrics
    assert [(r["step"], r["split"]) for r in records] == [
        *((s, "train") for s in (2, 4, 6, 8, 10)),
        (10, "val"),
        *((s, "train") for s in (12, 14, 16, 18, 20)),
        (20, "val"),
    ]
    assert set(records[0]) == {"step", "split", "time", "loss", "lr", "images_per_sec", "epoch"}
    assert set(records[5]) == {"step", "split", "time", "epoch", "val_loss", "val_top1", "val_top5"}
    assert records[5]["epoch"] == 1.0


def test_resume_truncates_records_after_the_checkpoint(run_inprocess, tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    run_inprocess(*SMALL, "trainer.max_steps=13", "trainer.checkpoint_every=5", job_dir=job_dir)
    before = [(r["step"], r["split"]) for r in map(json.loads, (job_dir / "metrics.jsonl").read_text().splitlines())]
    assert before[-3:] == [(12, "train"), (13, "train"), (13, "val")]  # stopped at max_steps
    # pretend the process died after logging step 13 but before its checkpoint: resume from step 10
    (job_dir / "checkpoints" / "step-00000013.ckpt").unlink()
    (job_dir / "checkpoints" / "latest").write_text("step-00000010.ckpt\n")
    out = run_inprocess(*SMALL, job_dir=job_dir)
    assert out.result["resumed_from_step"] == 10
    assert [(r["step"], r["split"]) for r in out.metrics] == [
        *((s, "train") for s in (2, 4, 6, 8, 10)),
        (10, "val"),
        *((s, "train") for s in (12, 14, 16, 18, 20)),
        (20, "val"),
    ]


def test_a_line_torn_by_a_crash_is_dropped_and_the_job_resumes(
    run_inprocess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash mid-write leaves half a line last (issue 37, item 9): every resume failed on it with a
    JSONDecodeError. It is dropped, with one line saying so."""
    job_dir = tmp_path / "job"
    run_inprocess(*SMALL, "trainer.max_steps=10", "trainer.checkpoint_every=5", job_dir=job_dir)
    with open(job_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "split": "tr')
    out = run_inprocess(*SMALL, job_dir=job_dir)
    assert out.result["resumed_from_step"] == 10 and out.result["steps"] == 20
    assert [r["step"] for r in out.metrics if r["split"] == "train"] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert "dropped 1 line(s) that are not complete JSON (a crash while it was written)" in capsys.readouterr().err


def test_a_fresh_run_replaces_an_old_file(run_inprocess, tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "metrics.jsonl").write_text('{"step": 999, "split": "train"}\n')
    out = run_inprocess(*SMALL, "trainer.epochs=1", "trainer.resume=false", job_dir=job_dir)
    assert 999 not in [r["step"] for r in out.metrics]
