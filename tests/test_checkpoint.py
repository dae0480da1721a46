"""Checkpoint layout, the `latest` pointer, retention, and what `trainer.resume` resolves to."""

from __future__ import annotations

import errno
import hashlib
import zlib
from pathlib import Path

import pytest

from ddlkit import ConfigError, RunError
from ddlkit.atomic import write_text
from ddlkit.checkpoint import (
    build_manifest,
    checkpoint_name,
    latest_checkpoint,
    manifest_path,
    mark_latest,
    no_space,
    read_manifest,
    remove_stale,
    resolve_resume,
    verify,
    write_manifest,
)


def save(job_dir: Path, step: int, keep: int = 2, directory: bool = False) -> Path:
    path = job_dir / "checkpoints" / checkpoint_name(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        path.mkdir()
        (path / "shard").write_text(str(step))
    else:
        path.write_text(str(step))
    write_manifest(path)  # as Run.save_checkpoint does, before marking it
    mark_latest(path, keep=keep)
    return path


def names(job_dir: Path) -> list[str]:
    """The checkpoint directory's entries, manifests left out."""
    return sorted(p.name for p in (job_dir / "checkpoints").iterdir() if not p.name.endswith(".manifest.json"))


def test_names_sort_by_step() -> None:
    assert checkpoint_name(9) == "step-00000009.ckpt"
    assert sorted([checkpoint_name(10), checkpoint_name(9), checkpoint_name(100)]) == [
        checkpoint_name(9),
        checkpoint_name(10),
        checkpoint_name(100),
    ]


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
        "directory with hydra.run.dir=<dir>, or pass trainer.resume=<path to checkpoint>."
    )
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
    assert str(info.value) == (
        f"trainer.resume={missing}: no such checkpoint. Use auto, true, false or an existing path."
    )


# ---------------------------------------------------------------------------- verification and fallback
# issue 17, items 5-7: resume never silently loses progress


def three(job_dir: Path, directory: bool = False) -> list[Path]:
    """Checkpoints at steps 10, 20, 30 (all kept), ``latest`` naming step 30."""
    return [save(job_dir, step, keep=3, directory=directory) for step in (10, 20, 30)]


def resolve(job_dir: Path, value: object = "auto") -> tuple[Path | None, list[str]]:
    warnings: list[str] = []
    return resolve_resume(job_dir, value, warn=warnings.append), warnings


def test_every_checkpoint_has_a_manifest_of_its_files(tmp_path: Path) -> None:
    path = save(tmp_path, 7, directory=True)
    manifest = read_manifest(path)
    assert manifest["checkpoint"] == "step-00000007.ckpt" and manifest["kind"] == "directory"
    assert manifest["files"] == {"shard": {"size": 1, "crc32": f"{zlib.crc32(b'7'):08x}"}}
    assert verify(path) is None


@pytest.mark.parametrize("algorithm", ["crc32", "sha256"])
def test_a_flipped_bit_fails_either_checksum_and_a_version_1_manifest_still_verifies(
    tmp_path: Path, algorithm: str
) -> None:
    """trainer.checkpoint_checksum picks the algorithm; a manifest of ddlkit < 0.2 (SHA-256, version
    1) is verified as before."""
    path = tmp_path / "step-00000001.ckpt"
    data = bytes(range(256)) * 4096
    path.write_bytes(data)
    manifest = build_manifest(path, algorithm)
    assert set(manifest["files"]["."]) == {"size", algorithm}
    if algorithm == "sha256":
        assert manifest["files"]["."]["sha256"] == hashlib.sha256(data).hexdigest()
        manifest["version"] = 1
    write_manifest(path, manifest)
    assert verify(path) is None
    path.write_bytes(data[:100_000] + bytes([data[100_000] ^ 1]) + data[100_001:])
    shown = {"crc32": "CRC-32", "sha256": "SHA-256"}[algorithm]
    assert verify(path) == f"step-00000001.ckpt does not match its {shown} (corrupted)"
    assert verify(path, hashes=False) is None  # the size still matches


def test_latest_naming_a_deleted_checkpoint_resumes_from_the_newest_intact_one(tmp_path: Path) -> None:
    """Item 5: it used to start from step 0 without a word (and then delete the older checkpoints)."""
    ckpts = three(tmp_path)
    ckpts[2].unlink()
    found, warnings = resolve(tmp_path)
    assert found == ckpts[1]
    assert warnings == [
        f"{tmp_path}/checkpoints/latest names step-00000030.ckpt, which does not exist (deleted?)",
        f"resuming from {ckpts[1]}, the newest intact checkpoint; damaged checkpoints are kept for inspection",
    ]


@pytest.mark.parametrize("damage", ["truncate", "flip-a-byte", "empty"])
def test_a_damaged_latest_checkpoint_is_passed_over_by_name(tmp_path: Path, damage: str) -> None:
    """Item 6: a truncated (or corrupted) latest checkpoint: fall back, name the bad file, delete nothing."""
    ckpts = [save(tmp_path, step, keep=3) for step in (10, 20)]
    bad = tmp_path / "checkpoints" / checkpoint_name(30)
    bad.write_bytes(b"0123456789" * 100)
    write_manifest(bad)
    mark_latest(bad, keep=3)
    data = bad.read_bytes()
    bad.write_bytes({"truncate": data[:-1], "flip-a-byte": data[:500] + b"X" + data[501:], "empty": b""}[damage])
    found, warnings = resolve(tmp_path)
    assert found == ckpts[1]
    reason = {
        "truncate": "step-00000030.ckpt is 999 bytes, 1000 were written (truncated)",
        "flip-a-byte": "step-00000030.ckpt does not match its CRC-32 (corrupted)",
        "empty": "step-00000030.ckpt is 0 bytes, 1000 were written (truncated)",
    }[damage]
    assert warnings[0] == f"checkpoint {bad} is damaged: {reason}; skipped"
    assert warnings[1].startswith(f"resuming from {ckpts[1]}, the newest intact checkpoint")
    assert names(tmp_path) == ["latest", "step-00000010.ckpt", "step-00000020.ckpt", "step-00000030.ckpt"]


def test_a_directory_checkpoint_missing_a_file_is_passed_over(tmp_path: Path) -> None:
    ckpts = three(tmp_path, directory=True)
    (ckpts[2] / "shard").unlink()
    found, warnings = resolve(tmp_path, "true")
    assert found == ckpts[1]
    assert warnings[0] == f"checkpoint {ckpts[2]} is damaged: step-00000030.ckpt/shard is missing; skipped"


def test_every_damaged_checkpoint_is_named_and_the_newest_intact_one_used(tmp_path: Path) -> None:
    ckpts = three(tmp_path)
    ckpts[2].write_text("")
    ckpts[1].write_text("x")
    found, warnings = resolve(tmp_path)
    assert found == ckpts[0]
    assert [w.split(" is damaged")[0] for w in warnings[:2]] == [f"checkpoint {ckpts[2]}", f"checkpoint {ckpts[1]}"]


@pytest.mark.parametrize("value", ["auto", "true"])
def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path, value: str) -> None:
    ckpts = three(tmp_path)
    for p in ckpts:
        p.write_text("")
    with pytest.raises(ConfigError) as info:
        resolve(tmp_path, value)
    message = str(info.value)
    assert message.startswith(
        f"{tmp_path}/checkpoints holds no intact checkpoint to resume from "
        f"(checkpoint {ckpts[2]} is damaged: step-00000030.ckpt is 0 bytes, 2 were written "
        "(truncated); checkpoint"
    )
    assert "start fresh with trainer.resume=false" in message
    assert names(tmp_path) == ["latest", *(p.name for p in ckpts)]  # nothing deleted


def test_a_pointer_to_nothing_with_no_checkpoints_left_is_an_error(tmp_path: Path) -> None:
    save(tmp_path, 10).unlink()
    with pytest.raises(ConfigError, match=r"names step-00000010.ckpt, which does not exist \(deleted\?\)"):
        resolve(tmp_path)


def test_a_missing_pointer_does_not_hide_the_checkpoints(tmp_path: Path) -> None:
    ckpts = three(tmp_path)
    (tmp_path / "checkpoints" / "latest").unlink()
    found, warnings = resolve(tmp_path)
    assert found == ckpts[2]
    assert warnings[0] == f"{tmp_path}/checkpoints/latest is missing"


def test_a_checkpoint_newer_than_the_pointer_is_not_resumed(tmp_path: Path) -> None:
    """A checkpoint the pointer never reached (a fresh start left the earlier run's behind)."""
    ckpts = three(tmp_path)
    write_text(tmp_path / "checkpoints" / "latest", ckpts[1].name + "\n")
    assert resolve(tmp_path) == (ckpts[1], [])


def test_a_checkpoint_without_a_manifest_is_used_unverified(tmp_path: Path) -> None:
    """Checkpoints of an older ddlkit have none: they still resume (and fall back)."""
    old = tmp_path / "checkpoints" / checkpoint_name(10)
    old.parent.mkdir(parents=True)
    old.write_text("10")
    (tmp_path / "checkpoints" / "latest").write_text(old.name + "\n")
    assert resolve(tmp_path) == (old, [])
    new = save(tmp_path, 20, keep=3)
    new.write_text("")
    found, warnings = resolve(tmp_path)
    assert found == old
    assert warnings[-1] == (
        f"resuming from {old}, the newest intact checkpoint (it has no manifest, so it is not "
        "verified); damaged checkpoints are kept for inspection"
    )


def test_a_damaged_checkpoint_given_by_path_is_refused(tmp_path: Path) -> None:
    ckpt = save(tmp_path / "earlier", 40)
    ckpt.write_text("4")
    with pytest.raises(ConfigError) as info:
        resolve_resume(tmp_path / "new", str(ckpt))
    assert str(info.value) == (
        f"trainer.resume={ckpt}: checkpoint {ckpt} is damaged: step-00000040.ckpt is 1 bytes, "
        "2 were written (truncated). Pass another checkpoint, or start fresh with "
        "trainer.resume=false."
    )
    with pytest.raises(ConfigError, match=f"^{tmp_path}/earlier/checkpoints holds no intact checkpoint"):
        resolve_resume(tmp_path / "new", str(tmp_path / "earlier"))  # its job directory


def test_mark_latest_replaces_nothing_with_an_unverified_checkpoint(tmp_path: Path) -> None:
    """Nothing older is deleted, and the pointer stays, until the new checkpoint matches its manifest."""
    ckpts = [save(tmp_path, step, keep=1) for step in (10,)]
    unmarked = tmp_path / "checkpoints" / checkpoint_name(20)
    unmarked.write_text("20")
    with pytest.raises(RunError, match="has no manifest"):
        mark_latest(unmarked, keep=1)
    write_manifest(unmarked)
    unmarked.write_text("2")  # truncated after its manifest was taken
    with pytest.raises(RunError, match=r"does not match its manifest after writing: step-00000020.ckpt is 1 bytes"):
        mark_latest(unmarked, keep=1)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000010.ckpt\n"
    assert ckpts[0].read_text() == "10" and verify(ckpts[0]) is None


def test_remove_stale_clears_what_interrupted_writes_left(tmp_path: Path) -> None:
    ckpts = three(tmp_path)
    ckdir = tmp_path / "checkpoints"
    tmp_file = ckdir / ".step-00000040.ckpt.k2j3h4.tmp"
    tmp_file.mkdir()
    (tmp_file / "step-00000040.ckpt").write_bytes(b"half")
    (ckdir / ".latest.abc.tmp").mkdir()
    (ckdir / ".step-00000040.ckpt.manifest.json.x1.tmp").write_text("{")
    (ckdir / ".step-00000030.ckpt.old").mkdir()
    orphan = ckdir / "step-00000040.ckpt.manifest.json"  # its checkpoint never arrived
    orphan.write_text("{}")
    removed = remove_stale(ckdir)
    assert sorted(p.name for p in removed) == [
        ".latest.abc.tmp",
        ".step-00000030.ckpt.old",
        ".step-00000040.ckpt.k2j3h4.tmp",
        ".step-00000040.ckpt.manifest.json.x1.tmp",
        "step-00000040.ckpt.manifest.json",
    ]
    assert sorted(p.name for p in ckdir.iterdir()) == sorted(
        ["latest", *(p.name for p in ckpts), *(manifest_path(p).name for p in ckpts)]
    )
    assert remove_stale(ckdir) == [] and remove_stale(tmp_path / "none") == []


# ---------------------------------------------------------------------------- a full disk
def test_no_space_is_recognised_in_an_exception_chain(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert no_space(full, tmp_path) == "no space left"
    assert no_space(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path) == "disk quota exceeded"
    try:
        try:
            raise full
        except OSError:
            torch_says = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
            raise RuntimeError(torch_says)  # noqa: B904 -- implicitly chained (__context__), as PyTorch's error is
    except RuntimeError as wrapped:
        assert no_space(wrapped, tmp_path) == "no space left"
    assert no_space(RuntimeError("unexpected pos 576 vs 534"), tmp_path) is None  # this disk has room
    assert no_space(OSError(errno.EIO, "I/O error"), tmp_path, slack=0) is None


def test_no_space_asks_the_file_system_when_the_error_does_not_say(tmp_path: Path, mount_tmpfs) -> None:
    """PyTorch reports a full disk as ``RuntimeError: ... unexpected pos ...``, with no errno."""
    tiny_fs = mount_tmpfs(tmp_path / "tiny", "2m")
    err = RuntimeError("unexpected pos 576 vs 534")
    assert no_space(err, tiny_fs) is None
    with pytest.raises(OSError) as info, open(tiny_fs / "fill", "wb") as f:
        f.write(b"\0" * (4 << 20))
        f.flush()
    assert info.value.errno == errno.ENOSPC
    assert no_space(err, tiny_fs) == "no space left"
