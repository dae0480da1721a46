"""Checkpoint layout, the `latest` pointer, retention, and what `trainer.resume` resolves to."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit import ConfigError
from ddlkit.checkpoint import checkpoint_name, latest_checkpoint, mark_latest, resolve_resume


def save(job_dir: Path, step: int, keep: int = 2, directory: bool = False) -> Path:
    path = job_dir / "checkpoints" / checkpoint_name(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        path.mkdir()
        (path / "shard").write_text(str(step))
    else:
        path.write_text(str(step))
    mark_latest(path, keep=keep)
    return path


def names(job_dir: Path) -> list[str]:
    return sorted(p.name for p in (job_dir / "checkpoints").iterdir())


def test_names_sort_by_step() -> None:
    assert checkpoint_name(9) == "step-00000009.ckpt"
    assert sorted([checkpoint_name(10), checkpoint_name(9), checkpoint_name(100)]) == [
        checkpoint_name(9), checkpoint_name(10), checkpoint_name(100)]


def test_mark_latest_keeps_the_newest_n(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        last = save(tmp_path, step, keep=2)
    assert names(tmp_path) == ["latest", "step-00000015.ckpt", "step-00000020.ckpt"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000020.ckpt\n"
    assert latest_checkpoint(tmp_path) == last
    save(tmp_path, 25, keep=1)
    assert names(tmp_path) == ["latest", "step-00000025.ckpt"]


def test_directory_checkpoints_are_removed_whole(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step, keep=1, directory=True)
    assert names(tmp_path) == ["latest", "step-00000003.ckpt"]


def test_no_latest_without_a_pointer_or_its_target(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    path = save(tmp_path, 4)
    path.unlink()
    assert latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("value", ["auto", "AUTO", " auto "])
def test_auto_resumes_when_there_is_a_checkpoint(tmp_path: Path, value: str) -> None:
    assert resolve_resume(tmp_path, value) is None
    path = save(tmp_path, 7)
    assert resolve_resume(tmp_path, value) == path


@pytest.mark.parametrize("value", [True, "true", "yes", "on"])
def test_true_requires_a_checkpoint(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_resume(tmp_path, value)
    assert str(info.value) == (
        f"trainer.resume=true but {tmp_path}/checkpoints holds no checkpoint. Point the run at the earlier job's "
        "directory with hydra.run.dir=<dir>, or pass trainer.resume=<path to checkpoint>.")
    path = save(tmp_path, 3)
    assert resolve_resume(tmp_path, value) == path


@pytest.mark.parametrize("value", [False, "false", "no", "off", "none", "null", None])
def test_false_starts_fresh_even_with_a_checkpoint(tmp_path: Path, value: object) -> None:
    save(tmp_path, 3)
    assert resolve_resume(tmp_path, value) is None


def test_a_path_to_a_checkpoint_or_to_another_job(tmp_path: Path) -> None:
    other = tmp_path / "earlier-job"
    ckpt = save(other, 40)
    here = tmp_path / "new-job"
    assert resolve_resume(here, str(ckpt)) == ckpt.resolve()
    assert resolve_resume(here, str(other)) == ckpt  # a job directory: its latest checkpoint


def test_a_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(ConfigError) as info:
        resolve_resume(tmp_path, str(missing))
    assert str(info.value) == (f"trainer.resume={missing}: no such checkpoint. "
                               "Use auto, true, false or an existing path.")
