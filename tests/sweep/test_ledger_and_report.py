"""The sweep ledger (resumability) and the sweep report (CSV, Markdown, PNG)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ddlkit import ConfigError
from ddlkit.launch.sweep.ledger import LEDGER_FILE, JobRecord, Ledger
from ddlkit.launch.sweep.report import LiveReport, rows, varying_overrides, write_report
from ddlkit.testing import wait_for


def test_a_new_ledger_records_every_job_and_is_written_atomically(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path, "s")
    assert ledger.reconcile([(0, ["lr=0.1"], str(tmp_path / "0")), (1, ["lr=0.2"], str(tmp_path / "1"))]) == []
    ledger.save()
    ledger.update(1, status="completed", result={"final_loss": 1.5})
    # the change is in the journal at once: a launcher killed now loses nothing
    assert Ledger.open(tmp_path, "s").jobs[1].result == {"final_loss": 1.5}
    ledger.save()
    data = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert data["name"] == "s" and data["version"] == 1
    assert {n: (j["overrides"], j["status"]) for n, j in data["jobs"].items()} == {
        "0": (["lr=0.1"], "pending"),
        "1": (["lr=0.2"], "completed"),
    }
    assert [p.name for p in tmp_path.iterdir()] == [LEDGER_FILE]  # no temporary file left behind


def test_reopening_keeps_the_jobs_and_names_the_completed_ones(tmp_path: Path) -> None:
    first = Ledger.open(tmp_path, "s")
    first.reconcile([(0, ["lr=0.1"], "d0"), (1, ["lr=0.2"], "d1"), (2, ["lr=0.3"], "d2")])
    first.update(0, status="completed", attempts=1)
    first.update(1, status="failed", attempts=2, error="boom")
    again = Ledger.open(tmp_path, "ignored: the ledger keeps its name")
    assert again.name == "s"
    assert again.reconcile([(0, ["lr=0.1"], "d0"), (1, ["lr=0.2"], "d1"), (2, ["lr=0.3"], "d2")]) == [0]
    assert (again.jobs[1].status, again.jobs[1].attempts, again.jobs[1].error) == ("failed", 2, "boom")


def test_ledger_writing_grows_linearly_with_the_number_of_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = 3000
    ledger = Ledger.open(tmp_path, "s")
    ledger.reconcile((n, [f"lr={n}"], f"d{n}") for n in range(jobs))
    rewrites = []
    save = Ledger.save
    monkeypatch.setattr(Ledger, "save", lambda self: (rewrites.append(1), save(self)))
    for n in range(jobs):  # every job starts, then ends: two changes each
        ledger.update(n, status="running", attempts=1)
        ledger.update(n, status="completed", result={"final_loss": 1.0 / (n + 1)})
    # ledger.json (O(jobs) bytes) is rewritten once per `jobs` changes, not on each: O(jobs) in all
    assert len(rewrites) == 2
    reopened = Ledger.open(tmp_path, "s")
    assert all(r.status == "completed" for r in reopened.jobs.values())
    assert reopened.jobs[jobs - 1].result == {"final_loss": 1.0 / jobs}


def test_a_journal_line_cut_short_by_a_killed_launcher_is_ignored(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path, "s")
    ledger.reconcile([(0, ["lr=0.1"], "d0"), (1, ["lr=0.2"], "d1")])
    ledger.save()
    ledger.update(0, status="completed")
    with (tmp_path / "ledger.journal.jsonl").open("a") as journal:
        journal.write('{"num": 1, "status": "compl')
    reopened = Ledger.open(tmp_path, "s")
    assert (reopened.jobs[0].status, reopened.jobs[1].status) == ("completed", "pending")


def test_another_sweep_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = Ledger.open(tmp_path, "s")
    first.reconcile([(0, ["lr=0.1"], "d0")])
    first.save()
    with pytest.raises(ConfigError) as info:
        Ledger.open(tmp_path, "s").reconcile([(0, ["lr=0.5"], "d0")])
    assert str(info.value) == (
        f"{tmp_path} holds another sweep: its job #0 was lr=0.1, this sweep's is lr=0.5. Resume with the same "
        "command, or give this sweep its own hydra.sweep.dir."
    )


def test_an_unreadable_ledger_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / LEDGER_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="is not a readable sweep ledger"):
        Ledger.open(tmp_path, "s")


def record(num: int, overrides: list[str], status: str, result: dict | None = None, **kw: object) -> JobRecord:
    return JobRecord(num, overrides, f"/sweeps/s/{num}", status=status, result=result, **kw)


def test_the_report_names_jobs_by_what_varies() -> None:
    labels = varying_overrides(
        [
            record(0, ["epochs=1", "lr=0.1", "model=a"], "completed"),
            record(1, ["epochs=1", "lr=0.2", "model=a"], "completed"),
            record(2, ["epochs=1", "lr=0.2", "model=a", "+extra=x"], "completed"),
        ]
    )
    assert labels == {0: "lr=0.1", 1: "lr=0.2", 2: "lr=0.2 +extra=x"}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path / LEDGER_FILE, "sweep-1")
    results = {0: (100.0, 2.0, 0.25), 1: (300.0, 1.5, 0.5), 3: (200.0, 1.0, 0.125)}
    for num, lr in enumerate(["0.1", "0.2", "0.3", "0.4"]):
        done = num in results
        ledger.jobs[num] = JobRecord(
            num,
            ["trainer.epochs=1", f"optimizer.lr={lr}"],
            str(tmp_path / str(num)),
            status="completed" if done else "failed",
            attempts=1,
            duration_s=10.0 + num,
            restarts=2 if num == 3 else 0,
            result=dict(zip(("images_per_sec", "final_loss", "best_top1"), results[num], strict=True))
            if done
            else None,
        )
    return ledger


def test_the_report_sorts_by_the_chosen_metric_best_first_and_missing_last(ledger: Ledger) -> None:
    assert [r["job"] for r in rows(ledger, "best_top1")] == [1, 0, 3, 2]
    assert [r["job"] for r in rows(ledger, "final_loss")] == [3, 1, 0, 2]
    assert [r["job"] for r in rows(ledger, "images_per_sec")] == [1, 3, 0, 2]
    assert [r["job"] for r in rows(ledger, "duration_s")] == [0, 1, 2, 3]


@pytest.mark.extras  # report.png: matplotlib (the sweep extra)
def test_the_report_files(ledger: Ledger, tmp_path: Path) -> None:
    report = write_report(ledger, "best_top1")
    with open(report.csv, newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"], r["status"], r["best_top1"], r["job_dir"]) for r in table] == [
        ("1", "optimizer.lr=0.2", "completed", "0.5", "1"),
        ("0", "optimizer.lr=0.1", "completed", "0.25", "0"),
        ("3", "optimizer.lr=0.4", "completed", "0.125", "3"),
        ("2", "optimizer.lr=0.3", "failed", "", "2"),
    ]
    assert list(table[0]) == [
        "job",
        "overrides",
        "status",
        "attempts",
        "restarts",
        "duration_s",
        "images_per_sec",
        "final_loss",
        "best_top1",
        "job_dir",
    ]
    assert report.markdown.read_text().splitlines() == [
        "# Sweep sweep-1: 4 jobs, by best_top1 (largest first)",
        "",
        "| job | overrides | status | attempts | restarts | duration (s) | images/sec | final loss | best val top-1 "
        "| directory |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
        "| 1 | optimizer.lr=0.2 | completed | 1 | 0 | 11.0 | 300.0 | 1.5000 | 0.5000 | 1 |",
        "| 0 | optimizer.lr=0.1 | completed | 1 | 0 | 10.0 | 100.0 | 2.0000 | 0.2500 | 0 |",
        "| 3 | optimizer.lr=0.4 | completed | 1 | 2 | 13.0 | 200.0 | 1.0000 | 0.1250 | 3 |",
        "| 2 | optimizer.lr=0.3 | failed | 1 | 0 | 12.0 | - | - | - | 2 |",
    ]
    assert report.png == tmp_path / "report.png"
    from matplotlib.image import imread

    image = imread(report.png)
    assert image.shape[0] > 100 and image.shape[1] > 400  # a real picture, one bar per job
    # blue bars for the three jobs with the metric
    assert ((image[..., 0] < 0.2) & (image[..., 2] > 0.6)).sum() > 1000


@pytest.mark.extras  # report.png: matplotlib (the sweep extra)
def test_the_live_report_is_rewritten_in_the_background_as_jobs_end(ledger: Ledger, tmp_path: Path) -> None:
    live = LiveReport("best_top1")
    first_job = {0: ledger.jobs.pop(0)}
    rest, ledger.jobs = ledger.jobs, first_job
    live.update(ledger)  # job 0 ended: the report shows it while the others still run
    wait_for(lambda: (tmp_path / "report.md").is_file(), "the report written in the background", timeout=30, pace=0.02)
    assert "1 job," in (tmp_path / "report.md").read_text()
    ledger.jobs = {**first_job, **rest}
    report = live.close(ledger)  # the final report, written in the foreground
    assert "4 jobs" in report.markdown.read_text()
    assert report.png == tmp_path / "report.png"
    assert not live._thread.is_alive()
