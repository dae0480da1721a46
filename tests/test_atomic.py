"""Atomic writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit.atomic import atomic_path, write_json, write_text


def test_success_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model.bin"
    with atomic_path(target) as tmp:
        assert tmp != target and not target.exists()
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.bin"]


def test_a_failing_writer_leaves_the_old_file_intact(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_text("old and complete")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("disk full")
    assert target.read_text() == "old and complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary left behind


def test_a_failing_writer_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(OSError), atomic_path(tmp_path / "new.txt"):
        raise OSError("no space left")
    assert list(tmp_path.iterdir()) == []


def test_directories_are_swapped_whole(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old-shard").write_text("old")
    with atomic_path(target, directory=True) as tmp:
        assert tmp.is_dir()
        (tmp / "shard-0").write_text("a")
        (tmp / "shard-1").write_text("b")
    assert sorted(p.name for p in target.iterdir()) == ["shard-0", "shard-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_write_json_and_text(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json", {"b": 1, "a": Path("/x")})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": "/x",\n  "b": 1\n}\n'
    assert json.loads((tmp_path / "a.json").read_text()) == {"a": "/x", "b": 1}
    write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
