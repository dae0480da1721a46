"""``ddlkit data prepare|manifest|upload`` (to a directory; blob:// in plugins/ddlkit-azure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from ddlkit.builtin.imagefolder.index import load_index
from ddlkit.launch.cli import main
from ddlkit.storage import Manifest, sha256_file

WNIDS = ["n01440764", "n01443537", "n01484850"]


@pytest.fixture
def flat_val(tmp_path: Path) -> tuple[Path, list[str]]:
    """ImageNet's official validation layout: flat files, labels in a separate list."""
    src = tmp_path / "ILSVRC2012_img_val"
    src.mkdir()
    labels = []
    for i in range(1, 7):
        Image.new("RGB", (20, 16), (i * 30, 0, 0)).save(src / f"ILSVRC2012_val_{i:08d}.JPEG")
        labels.append(WNIDS[i % 3])
    return src, labels


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_ino, sha256_file(p)) for p in folder.iterdir()}


@pytest.mark.parametrize("form", ["wnid-per-line", "pairs", "kaggle-csv", "class-ids"])
def test_prepare_makes_class_folders_without_touching_the_source(
    flat_val: tuple[Path, list[str]], tmp_path: Path, form: str
) -> None:
    src, labels = flat_val
    names = sorted(p.name for p in src.iterdir())
    extra: list[str] = []
    if form == "wnid-per-line":
        text = "\n".join(labels)
    elif form == "pairs":
        text = "\n".join(f"{n} {w}" for n, w in zip(names, labels, strict=True))
    elif form == "kaggle-csv":
        text = "ImageId,PredictionString\n" + "\n".join(
            f"{Path(n).stem},{w} 1 2 3 4 {w} 5 6 7 8" for n, w in zip(names, labels, strict=True)
        )
    else:
        (tmp_path / "synsets.txt").write_text("\n".join(f"{w} some words" for w in WNIDS))
        text = "\n".join(str(WNIDS.index(w) + 1) for w in labels)
        extra = ["--synsets", str(tmp_path / "synsets.txt")]
    (tmp_path / "labels.txt").write_text(text + "\n")
    train = tmp_path / "train_src"
    for w in WNIDS:
        (train / w).mkdir(parents=True)
        Image.new("RGB", (20, 16)).save(train / w / f"{w}_1.JPEG")
    before = _snapshot(src)
    out = tmp_path / "imagenet"
    args = [
        "data",
        "prepare",
        str(out),
        "--val-images",
        str(src),
        "--val-labels",
        str(tmp_path / "labels.txt"),
        "--train",
        str(train),
        *extra,
    ]
    assert main(args) == 0
    assert _snapshot(src) == before, "the source must be left exactly as it was"
    for name, wnid in zip(names, labels, strict=True):
        placed = out / "validation" / wnid / name
        assert placed.samefile(src / name)  # a hard link: no second copy of ImageNet
    manifest = Manifest.read(out / "manifest.tsv")
    assert len(manifest) == 6 + 3
    entry = manifest.by_path[f"validation/{labels[0]}/{names[0]}"]
    assert (entry.size, entry.sha256, entry.label) == (
        (src / names[0]).stat().st_size,
        sha256_file(src / names[0]),
        labels[0],
    )
    index = load_index(str(out))
    assert (index.source, len(index.train), len(index.val)) == ("manifest", 3, 6)
    assert main(args) == 0  # re-running finishes or repeats harmlessly


def test_prepare_reports_bad_label_files(
    flat_val: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = flat_val
    (tmp_path / "ids.txt").write_text("1\n2\n3\n1\n2\n3\n")
    code = main(
        ["data", "prepare", str(tmp_path / "out"), "--val-images", str(src), "--val-labels", str(tmp_path / "ids.txt")]
    )
    assert code == 2 and "--synsets" in capsys.readouterr().err
    (tmp_path / "short.txt").write_text("n01440764\n")
    assert (
        main(
            [
                "data",
                "prepare",
                str(tmp_path / "out"),
                "--val-images",
                str(src),
                "--val-labels",
                str(tmp_path / "short.txt"),
            ]
        )
        == 2
    )
    assert "1 labels for 6 images" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_upload_to_a_directory_is_resumable_and_skips_what_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    (src / "train" / WNIDS[0]).mkdir(parents=True)
    for i in range(5):
        (src / "train" / WNIDS[0] / f"{i}.JPEG").write_bytes(os.urandom(1000 + i))
    assert main(["data", "manifest", str(src)]) == 0
    dest = tmp_path / "dest"
    assert main(["data", "upload", str(src), str(dest)]) == 0
    assert "uploaded 5 files" in capsys.readouterr().out
    assert Manifest.read(dest / "manifest.tsv").dumps() == (src / "manifest.tsv").read_text()
    (dest / "train" / WNIDS[0] / "3.JPEG").unlink()  # an interrupted upload
    assert main(["data", "upload", str(src), str(dest)]) == 0
    assert "uploaded 1 files (0.0 MB)" in capsys.readouterr().out
    (src / "train" / WNIDS[0] / "0.JPEG").write_bytes(b"changed")
    assert main(["data", "upload", str(src), str(dest)]) == 2  # a stale manifest is a config error
    assert "ddlkit data manifest" in capsys.readouterr().err
