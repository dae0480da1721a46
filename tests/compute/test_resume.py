"""What a target that copies a job directory to its nodes sends for a run that resumes: the
checkpoint the run will load, not the older ones (compute=ray sends it on every restart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit.checkpoint import checkpoint_name, mark_latest, write_manifest
from ddlkit.compute.resume import files_to_leave, resume_setting


def save(job_dir: Path, step: int, *, directory: bool = False) -> Path:
    path = job_dir / "checkpoints" / checkpoint_name(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        path.mkdir()
        (path / "shard").write_text(str(step) * 100)
    else:
        path.write_text(str(step) * 100)
    write_manifest(path)
    mark_latest(path, keep=3)
    return path


def job(tmp_path: Path, *, directory: bool = False) -> Path:
    """A job directory with checkpoints at steps 10, 20, 30 and the files a run leaves beside them."""
    for step in (10, 20, 30):
        save(tmp_path, step, directory=directory)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "rank-0.log").write_text("train\n")
    return tmp_path


def names(paths: list[Path], root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in paths)


def split(job_dir: Path, resume: object) -> tuple[list[Path], list[Path]]:
    """(what a target sends, what it leaves behind) of ``job_dir``'s files."""
    leave = files_to_leave(job_dir, resume)
    return [p for p in job_dir.rglob("*") if p.is_file() and p not in leave], leave


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
def test_the_newest_checkpoint_goes_and_the_older_ones_stay(tmp_path: Path, directory: bool) -> None:
    send, leave = split(job(tmp_path, directory=directory), "auto")
    newest = "checkpoints/step-00000030.ckpt" + ("/shard" if directory else "")
    assert names(send, tmp_path) == sorted(
        ["checkpoints/latest", newest, "checkpoints/step-00000030.ckpt.manifest.json", "metrics.jsonl", "rank-0.log"]
    )
    older = [f"checkpoints/step-000000{s}.ckpt" for s in (10, 20)]
    assert names(leave, tmp_path) == sorted(
        [*(o + ("/shard" if directory else "") for o in older), *(o + ".manifest.json" for o in older)]
    )


def test_a_damaged_newest_checkpoint_stays_and_the_one_the_run_falls_back_to_goes(tmp_path: Path) -> None:
    """The run verifies the checkpoint it resumes from, and so does the choice of what to send."""
    job(tmp_path)
    newest = tmp_path / "checkpoints" / checkpoint_name(30)
    newest.write_text("3" * 99)  # truncated
    send, leave = split(tmp_path, "auto")
    assert "checkpoints/step-00000020.ckpt" in names(send, tmp_path)
    assert {"checkpoints/step-00000030.ckpt", "checkpoints/step-00000010.ckpt"} <= set(names(leave, tmp_path))


@pytest.mark.parametrize("resume", ["false", "damaged", "elsewhere", "one checkpoint"])
def test_nothing_is_left_out_where_the_run_does_not_resume_from_one_of_several(tmp_path: Path, resume: str) -> None:
    """A fresh start, no intact checkpoint (the run says so itself), a checkpoint outside the job
    directory, or no older one to leave: every file goes, as before."""
    job_dir = tmp_path / "job"
    if resume == "one checkpoint":
        save(job_dir, 10)
    else:
        job(job_dir)
    value: object = "auto"
    if resume == "false":
        value = False
    elif resume == "damaged":
        for path in (job_dir / "checkpoints").glob("*.ckpt"):
            path.write_text("x")
    elif resume == "elsewhere":
        value = save(tmp_path / "other", 5)
    assert files_to_leave(job_dir, value) == []


def test_the_setting_comes_from_the_job_file(tmp_path: Path) -> None:
    job_file = tmp_path / "job.json"
    assert resume_setting(job_file) == "auto"  # no job file: the default
    job_file.write_text(json.dumps({"config": {"trainer": {"resume": False}}}))
    assert resume_setting(job_file) is False
    job_file.write_text(json.dumps({"config": {}}))
    assert resume_setting(job_file) == "auto"
