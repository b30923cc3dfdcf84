"""Canary records for the one-run audit and their random membership.

Input-space canaries are out-of-distribution images the model can single out
and memorise: random block patterns (each an independent draw), with a label
drawn at random.  Each canary is included in the training data independently
with probability 1/2; the membership draw is the auditor's secret and is never
shown to the training code.
"""

from __future__ import annotations

import numpy as np

from ..data.datafile import PreparedData, Split

BLOCK = 4  # pixels per block side: coarse enough to survive the diffusion noise at mid timesteps


def canary_images(m: int, image_size: int, channels: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """m random block patterns, uint8 [m, H, W, C], and labels int64 [m] (zeros when num_classes is 0)."""
    if m < 2:
        raise ValueError(f"canaries = {m}, expected at least 2")
    rng = np.random.default_rng(seed)
    cells = -(-image_size // BLOCK)
    blocks = rng.random((m, cells, cells, channels)) < 0.3
    images = np.repeat(np.repeat(blocks, BLOCK, axis=1), BLOCK, axis=2)[:, :image_size, :image_size]
    labels = rng.integers(0, num_classes, m) if num_classes > 0 else np.zeros(m, dtype=np.int64)
    return (images * 255).astype(np.uint8), labels.astype(np.int64)


def draw_membership(m: int, seed: int) -> np.ndarray:
    """bool [m]: each canary in with probability 1/2, independently."""
    return np.random.default_rng(seed + 1).random(m) < 0.5


def with_canaries(data: PreparedData, images: np.ndarray, labels: np.ndarray, included: np.ndarray) -> PreparedData:
    """A copy of ``data`` whose private split also holds the included canaries (appended, so indices shift nothing)."""
    train = data.splits["train"]
    new_images = np.concatenate([train.images, images[included]])
    new_labels = None if train.labels is None else np.concatenate([train.labels, labels[included]])
    splits = dict(data.splits)
    splits["train"] = Split(new_images, new_labels)
    attrs = dict(data.attrs, n_train=len(new_images))
    return PreparedData(splits=splits, class_names=data.class_names, labelled=data.labelled, image_size=data.image_size,
                        channels=data.channels, attrs=attrs)
