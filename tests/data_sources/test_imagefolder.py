"""data=imagefolder: listing, decoding (odd and corrupt files), order, sharding, resumption,
per framework. Real JPEG files made with Pillow (ddlkit.testing.images)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ddlkit import ConfigError, DataSource, Shard
from ddlkit.builtin.imagefolder import ImageFolderConfig, ImageFolderData
from ddlkit.builtin.imagefolder.index import load_index
from ddlkit.images import Augment, CorruptImageError, crop_window, decode_into, decode_region, jpeg_header, sample_rng
from ddlkit.images._decode import simplejpeg
from ddlkit.storage import build_manifest
from ddlkit.testing.contracts import DataSourceContract
from ddlkit.testing.images import ImageDataset, make_image_dataset

SIZE = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    return make_image_dataset(
        tmp_path_factory.mktemp("imagenet") / "root", classes=3, train_per_class=8, val_per_class=3, odd_files=True
    )


@pytest.fixture(scope="module")
def corrupt_dataset(tmp_path_factory: pytest.TempPathFactory) -> ImageDataset:
    return make_image_dataset(
        tmp_path_factory.mktemp("corrupt") / "root",
        classes=3,
        train_per_class=6,
        val_per_class=2,
        odd_files=True,
        corrupt=True,
    )


def source(root: Path, **overrides: Any) -> ImageFolderData:
    return ImageFolderData(ImageFolderConfig(root=str(root), image_size=SIZE, **overrides))


def batches(loader: Any, epoch: int = 0, start: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.asarray(x), np.asarray(y)) for x, y in loader.iter_epoch(epoch, start)]


class TestImageFolderNumpy(DataSourceContract):
    batch_size = 4

    @pytest.fixture
    def data_source(self, dataset: ImageDataset) -> DataSource:
        return source(dataset.root)


#: the neutral loader's batches, and the PyTorch plugin's adapter of them (loader_as)
FORMATS = ["numpy", pytest.param("pytorch", marks=pytest.mark.plugins)]


def loader_as(fmt: str, loader: Any, **torch_options: Any) -> Any:
    """The neutral loader itself (``numpy``), or through the PyTorch plugin's adapter."""
    if fmt == "numpy":
        return loader
    from ddlkit_pytorch.data import torch_loader

    return torch_loader(loader, images=True, device="cpu", **{"channels_last": False, **torch_options})


@pytest.mark.plugins  # ddlkit-pytorch
def test_the_pytorch_pipeline_serves_the_contract_batches(dataset: ImageDataset) -> None:
    """The same images and labels, in order, as the neutral loader (NCHW; torch's resize rounds the
    crop box to whole pixels, Pillow's does not)."""
    neutral = source(dataset.root, workers=1).loader("train", batch_size=4, shard=Shard(1, 2), seed=5)
    for (x, y), (xn, yn) in zip(loader_as("pytorch", neutral).iter_epoch(2, 1), neutral.iter_epoch(2, 1), strict=True):
        assert np.array_equal(y.numpy(), yn) and np.abs(x.permute(0, 2, 3, 1).numpy() - xn).mean() < 0.05


# ---------------------------------------------------------------------------- listing
def test_class_folders_any_extension_case_sorted_classes(dataset: ImageDataset) -> None:
    index = load_index(str(dataset.root))
    assert index.source == "folders"
    assert index.classes == tuple(sorted(dataset.classes))
    assert len(index.train) == 3 * 8 and len(index.val) == 3 * 3
    assert {Path(p).suffix for p in index.train.paths} == {".JPEG", ".jpg", ".jpeg"}
    for path, label in zip(index.train.paths, index.train.labels, strict=True):
        assert path.split("/")[1] == index.classes[label]


def test_manifest_listing_equals_the_folder_walk(dataset: ImageDataset, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(dataset.root, copy)
    build_manifest(copy).write(copy / "manifest.tsv")
    (copy / "train" / dataset.classes[0] / "not-listed.JPEG").write_bytes(b"x")  # the manifest is what counts
    by_manifest, by_walk = load_index(str(copy)), load_index(str(dataset.root))
    assert by_manifest.source == "manifest"
    assert (by_manifest.classes, by_manifest.train, by_manifest.val) == (by_walk.classes, by_walk.train, by_walk.val)


def test_csv_index_with_one_based_num_id(dataset: ImageDataset, tmp_path: Path) -> None:
    root = tmp_path / "csv"
    shutil.copytree(dataset.root, root)
    walk = load_index(str(dataset.root))
    for split, name in (("train", "train.csv"), ("val", "validation.csv")):
        part = walk.split(split)
        rows = [f"{p.split('/', 1)[1]},{walk.classes[y]},{y + 1}" for p, y in zip(part.paths, part.labels, strict=True)]
        (root / name).write_text("filenames,wnid,num_id\n" + "\n".join(rows) + "\n")
    index = load_index(str(root))
    assert index.source == "csv"
    assert index.classes == walk.classes
    assert (index.train, index.val) == (walk.train, walk.val)
    (root / "train.csv").write_text("filenames,num_id\nn01440764/x.JPEG,0\n")
    with pytest.raises(ConfigError, match="1-based"):
        load_index(str(root))


def test_layout_errors_say_what_is_expected(tmp_path: Path, dataset: ImageDataset) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="train/<class>/<image>.*ddlkit data prepare"):
        load_index(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="not a directory"):
        load_index(str(tmp_path / "missing"))
    odd = tmp_path / "odd"
    shutil.copytree(dataset.root, odd)
    (odd / "validation" / "n99999999").mkdir()
    with pytest.raises(ConfigError, match="n99999999"):
        load_index(str(odd))


# ---------------------------------------------------------------------------- decoding
def _reference(path: Path) -> np.ndarray:
    """The validation transform done by hand with Pillow on the RGB image."""
    image = Image.open(path).convert("RGB")
    w, h = image.size
    resize = round(SIZE / 0.875)
    side = SIZE * min(w, h) / resize
    box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
    return np.asarray(image.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box), dtype=np.float32)


@pytest.mark.parametrize("decoder", ["pil", pytest.param("simplejpeg", marks=pytest.mark.extras)])
def test_grayscale_cmyk_and_png_content_decode_as_rgb(dataset: ImageDataset, decoder: str) -> None:
    aug = Augment(size=SIZE, train=False, val_resize=round(SIZE / 0.875), decoder=decoder)
    kinds = {}
    for rel in dataset.odd:
        out = np.zeros((SIZE, SIZE, 3), np.uint8)
        decode_into(str(dataset.root / rel), aug, None, out)
        kinds[rel] = Image.open(dataset.root / rel).mode
        # within JPEG's rounding of the reference (the fast path decodes at a reduced DCT scale)
        assert np.abs(out.astype(np.float32) - _reference(dataset.root / rel)).mean() < 6, rel
        if kinds[rel] == "L":
            assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
    assert sorted(kinds.values()) == ["CMYK", "L", "RGB", "RGB"]
    png = next(rel for rel in dataset.odd if Image.open(dataset.root / rel).format == "PNG")
    assert png.endswith(".JPEG")


def test_train_augmentation_varies_by_epoch_and_is_reproducible(dataset: ImageDataset) -> None:
    loader = source(dataset.root).loader("train", batch_size=24, shard=Shard(), seed=3)
    ((x0, y0),) = batches(loader, 0)
    ((x1, y1),) = batches(loader, 1)
    assert not np.array_equal(y0, y1), "the order is reshuffled every epoch"
    order0, order1 = np.argsort(y0, kind="stable"), np.argsort(y1, kind="stable")
    assert not np.allclose(x0[order0], x1[order1]), "crops differ between epochs"
    ((again, _),) = batches(loader, 1)
    assert np.array_equal(x1, again)
    assert x0.dtype == np.float32 and abs(float(x0.mean())) < 3 and x0.shape == (24, SIZE, SIZE, 3)


def test_shards_are_disjoint_and_cover_the_used_images(dataset: ImageDataset) -> None:
    from ddlkit.images import epoch_order

    n = 24
    shards = [epoch_order(n, batch_size=5, shard=Shard(r, 2), seed=0, epoch=4, train=True) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 10
    assert not set(shards[0]) & set(shards[1])
    val = [epoch_order(9, batch_size=4, shard=Shard(r, 2), seed=0, epoch=0, train=False) for r in range(2)]
    assert sorted(np.concatenate(val)) == list(range(8))


@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupt_file_is_an_error_that_names_it(corrupt_dataset: ImageDataset, fmt: str) -> None:
    bad = str(corrupt_dataset.root / corrupt_dataset.corrupt[0])
    loader = loader_as(
        fmt, source(corrupt_dataset.root, workers=1).loader("train", batch_size=19, shard=Shard(), seed=0)
    )
    with pytest.raises(CorruptImageError) as info:
        batches(loader)
    assert bad in str(info.value) and "data.on_corrupt=skip" in str(info.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_skipped_corrupt_files_are_counted_and_batches_stay_full(
    corrupt_dataset: ImageDataset, fmt: str, capfd: pytest.CaptureFixture[str]
) -> None:
    loader = loader_as(
        fmt,
        source(corrupt_dataset.root, on_corrupt="skip", workers=1).loader(
            "train", batch_size=19, shard=Shard(), seed=0
        ),
    )
    got = batches(loader) + batches(loader, 1)
    assert [len(y) for _, y in got] == [19, 19]
    assert loader.skipped == 2  # once per epoch
    err = capfd.readouterr().err
    assert err.count(f"skipped corrupt image {corrupt_dataset.root / corrupt_dataset.corrupt[0]}") == 1


@pytest.mark.plugins  # ddlkit-pytorch
def test_pytorch_batches_are_normalized_nchw_and_channels_last_on_request(dataset: ImageDataset) -> None:
    import torch

    src = source(dataset.root, workers=0)
    ((x, y),) = list(loader_as("pytorch", src.loader("train", batch_size=24, shard=Shard(), seed=0)).iter_epoch(0))
    ((xn, _),) = batches(src.loader("train", batch_size=24, shard=Shard(), seed=0))
    assert x.shape == (24, 3, SIZE, SIZE) and x.is_contiguous() and y.dtype == torch.int64
    # the same crops and flips; torch's resize (integer crop box) and Pillow's (fractional) differ by rounding
    assert np.abs(x.permute(0, 2, 3, 1).numpy() - xn).mean() < 0.05
    ((xc, _),) = list(
        loader_as("pytorch", src.loader("train", batch_size=24, shard=Shard(), seed=0), channels_last=True).iter_epoch(
            0
        )
    )
    assert xc.is_contiguous(memory_format=torch.channels_last) and torch.equal(xc, x)


def test_a_blob_root_must_be_staged_before_reading(tmp_path: Path) -> None:
    src = ImageFolderData(ImageFolderConfig(root="blob://container/imagenet"))
    with pytest.raises(ConfigError, match="storage=local_ssd"):
        _ = src.local_root


def test_no_framework_library_is_imported_with_the_data_source(tmp_path: Path) -> None:
    code = (
        "import sys, ddlkit.builtin.imagefolder, ddlkit.builtin.local_ssd_storage, ddlkit.launch.data_cli\n"
        "print(sorted(m for m in ('torch', 'tensorflow', 'PIL', 'numpy', 'azure') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.extras  # simplejpeg
def test_pil_and_simplejpeg_agree(dataset: ImageDataset) -> None:
    rel = next(p for p in load_index(str(dataset.root)).val.paths)
    outs = []
    for decoder in ("pil", "simplejpeg"):
        out = np.zeros((SIZE, SIZE, 3), np.uint8)
        decode_into(str(dataset.root / rel), Augment(SIZE, False, 37, decoder=decoder), None, out)
        outs.append(out.astype(np.float32))
    assert np.abs(outs[0] - outs[1]).mean() < 3


def test_png_bytes_with_a_jpeg_name_are_not_a_corrupt_file(tmp_path: Path) -> None:
    buf = io.BytesIO()
    Image.new("RGBA", (40, 30), (10, 200, 30, 128)).save(buf, "PNG")
    (tmp_path / "x.JPEG").write_bytes(buf.getvalue())
    out = np.zeros((SIZE, SIZE, 3), np.uint8)
    decode_into(
        str(tmp_path / "x.JPEG"), Augment(SIZE, False, 37, decoder="simplejpeg" if simplejpeg else "pil"), None, out
    )
    assert tuple(out[SIZE // 2, SIZE // 2]) == (10, 200, 30)


def test_16_bit_pngs_keep_their_values(tmp_path: Path) -> None:
    """Issue 17, item 20: a 16-bit grayscale PNG decoded as solid white (Pillow opens it as I;16 and
    its convert("RGB") clips every value above 255). Now its high byte, as TensorFlow decodes it."""
    gradient = (np.arange(SIZE * SIZE).reshape(SIZE, SIZE) * 64).astype(np.uint16)  # 0 .. 65472
    Image.fromarray(gradient).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    out = np.zeros((SIZE, SIZE, 3), np.uint8)
    decode_into(str(tmp_path / "g16.png"), Augment(SIZE, False, SIZE, decoder="pil"), None, out)
    assert np.array_equal(out[..., 0], (gradient >> 8).astype(np.uint8))
    assert (out[..., 0] == out[..., 2]).all() and out.min() == 0 and out.max() == 255


def _jpeg(mode: str = "RGB", **save: Any) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (40, 30), 128).save(buf, "JPEG", **save)
    return buf.getvalue()


def test_jpeg_header_reads_the_frame_without_decoding() -> None:
    assert jpeg_header(_jpeg()) == (40, 30, 3, False)
    assert jpeg_header(_jpeg(progressive=True)) == (40, 30, 3, False)
    assert jpeg_header(_jpeg("L")) == (40, 30, 1, False)
    assert jpeg_header(_jpeg("CMYK"))[2] == 4
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, "PNG")
    for not_a_jpeg in (png.getvalue(), b"", b"\xff\xd8\xff", _jpeg()[:20]):
        assert jpeg_header(not_a_jpeg) is None


@pytest.mark.parametrize("train", [True, False])
def test_crop_window_draws_the_cpu_paths_crop_and_flip(dataset: ImageDataset, train: bool) -> None:
    """data.decoder=gpu: the workers draw each crop from the header; it must be the one the CPU
    path draws (decode_region, in the DCT-scaled image's pixels) so that every decoder and a
    resumed run see the same crops."""
    aug = Augment(SIZE, train, 37, decoder="pil")
    colour = [
        p
        for p in sorted((dataset.root / "train").rglob("*"))
        if p.is_file() and str(p.relative_to(dataset.root)) not in dataset.odd
    ]
    flips = set()
    for index, path in enumerate(colour):
        region = decode_region(str(path), aug, sample_rng(3, 1, index))
        (left, top, right, bottom), flip = crop_window(path.read_bytes(), aug, sample_rng(3, 1, index))
        width, height = Image.open(path).size
        sx, sy = width / region.image.size[0], height / region.image.size[1]
        assert abs(left - region.box[0] * sx) <= 1 and abs(right - region.box[2] * sx) <= 1
        assert abs(top - region.box[1] * sy) <= 1 and abs(bottom - region.box[3] * sy) <= 1
        assert flip == region.flip
        flips.add(flip)
    assert flips == ({True, False} if train else {False})
    for rel in dataset.odd:  # grayscale, CMYK, PNG content: decoded on the CPU, and no draw made
        rnd = sample_rng(3, 1, 0)
        assert crop_window((dataset.root / rel).read_bytes(), aug, rnd) is None or rel.endswith(".jpg")
        assert rnd.random() == sample_rng(3, 1, 0).random() or rel.endswith(".jpg")


def test_crop_window_leaves_a_file_cut_short_to_the_cpu() -> None:
    data = _jpeg()
    assert crop_window(data, Augment(SIZE, False, 37), None) is not None
    assert crop_window(data + b"\x00" * 100, Augment(SIZE, False, 37), None) is not None  # padded after its end
    assert crop_window(data[:-2], Augment(SIZE, False, 37), None) is None


def test_decoder_gpu_is_refused_where_batches_are_decoded_on_the_cpu(dataset: ImageDataset) -> None:
    data = ImageFolderData(ImageFolderConfig(root=str(dataset.root), image_size=SIZE, decoder="gpu"))
    loader = data.loader("train", batch_size=4, shard=Shard(), seed=0)
    assert loader.native_spec().aug.device_decoding
    with pytest.raises(ConfigError, match="data.decoder=gpu needs a framework whose input pipeline decodes on the GPU"):
        next(iter(loader.iter_epoch(0)))
