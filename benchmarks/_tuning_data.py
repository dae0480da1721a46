"""The data of ``benchmarks/early_stopping.py``'s trials: ``data=custom
data.target=_tuning_data:noisy_classes`` (``benchmarks/`` on ``PYTHONPATH``).

``num_classes`` class patterns of ``image_size`` x ``image_size`` x 3 pixels, each sample its class's
pattern under Gaussian noise of standard deviation ``noise``: a problem that is learnt for several
epochs, whose final accuracy depends on the learning rate and the batch size, and which is made here
(no download) in a fraction of a second."""

from __future__ import annotations

import numpy as np


def noisy_classes(
    split: str,
    n: int = 65536,
    val_n: int = 2048,
    image_size: int = 8,
    num_classes: int = 16,
    noise: float = 6.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    count = n if split == "train" else val_n
    rng = np.random.default_rng([seed, split == "val"])
    labels = rng.integers(0, num_classes, count)
    patterns = np.random.default_rng(seed).normal(0.0, 1.0, (num_classes, image_size, image_size, 3))
    images = patterns[labels] + rng.normal(0.0, noise, (count, image_size, image_size, 3))
    return images.astype(np.float32), labels
