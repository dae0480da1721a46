"""Small real-image datasets for tests: ImageNet's layout with real JPEG files (Pillow).

::

    from ddlkit.testing.images import make_image_dataset

    root = make_image_dataset(tmp_path / "imagenet", classes=3, train_per_class=8, val_per_class=2,
                              odd_files=True)

``odd_files`` adds what real ImageNet has: a grayscale JPEG, a CMYK JPEG, PNG content behind a
``.JPEG`` name, and lower-case ``.jpg``/``.jpeg`` extensions; ``corrupt`` adds a truncated JPEG
(returned in :attr:`ImageDataset.corrupt`). Each class has its own dominant colour, so a model can
learn the labels quickly. Needs numpy and Pillow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CLASS_NAMES = ("n01440764", "n01443537", "n01484850", "n01491361", "n01494475", "n01496331", "n01498041", "n01514668")


@dataclass
class ImageDataset:
    root: Path
    classes: list[str]
    #: relative paths of the odd files (grayscale, CMYK, PNG content), which must decode fine
    odd: list[str] = field(default_factory=list)
    #: relative paths of files that cannot be decoded
    corrupt: list[str] = field(default_factory=list)


def _image(rng, cls: int, size: tuple[int, int]):
    import numpy as np
    from PIL import Image

    w, h = size
    base = np.zeros((h, w, 3), np.float32)
    base[..., cls % 3] = 160 + 40 * (cls // 3)
    y, x = np.mgrid[0:h, 0:w]
    base += 30 * np.sin(x / (4 + cls))[..., None] + rng.normal(0, 20, (h, w, 3))
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def make_image_dataset(
    root: Path,
    *,
    classes: int = 3,
    train_per_class: int = 8,
    val_per_class: int = 2,
    sizes: tuple[tuple[int, int], ...] = ((80, 60), (64, 96), (120, 90)),
    odd_files: bool = False,
    corrupt: bool = False,
    seed: int = 0,
) -> ImageDataset:
    import numpy as np

    rng = np.random.default_rng(seed)
    root = Path(root)
    names = list(CLASS_NAMES[:classes])
    ds = ImageDataset(root, names)
    for split, per_class in (("train", train_per_class), ("validation", val_per_class)):
        for c, name in enumerate(names):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                image = _image(rng, c, sizes[(i + c) % len(sizes)])
                stem = f"{name}_{split}_{i:04d}"
                if odd_files and split == "train" and c == 0 and i < 4:
                    kind = ("gray", "cmyk", "png", "jpg")[i]
                    rel = f"{split}/{name}/{stem}.{'jpg' if kind == 'jpg' else 'JPEG'}"
                    if kind == "gray":
                        image.convert("L").save(root / rel, "JPEG", quality=90)
                    elif kind == "cmyk":
                        image.convert("CMYK").save(root / rel, "JPEG", quality=90)
                    elif kind == "png":
                        image.save(root / rel, "PNG")
                    else:
                        image.save(root / rel, "JPEG", quality=90)
                    ds.odd.append(rel)
                    continue
                ext = ".jpeg" if odd_files and i == 4 else ".JPEG"
                image.save(folder / f"{stem}{ext}", "JPEG", quality=90)
    if corrupt:
        rel = f"train/{names[-1]}/{names[-1]}_train_corrupt.JPEG"
        good = (root / "train" / names[-1]).iterdir().__next__().read_bytes()
        (root / rel).write_bytes(good[: len(good) // 3])  # a truncated JPEG: the header parses, the data ends early
        ds.corrupt.append(rel)
    return ds
