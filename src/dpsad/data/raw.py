"""The in-memory form every source returns, and its validation."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DpsadError
from ..privacy.books.image_digests import canonical_digests
from .near_copies import perceptual_hashes


@dataclass
class RawDataset:
    """Images and labels as read from a source, before splitting.

    images: uint8, N x H x W x C.  labels: int64, N, values in [0, len(class_names)),
    or None for unlabelled data.  ``test_*`` hold an official test split when the
    source has one (MNIST, CelebA); otherwise the test split is drawn from the rest.
    ``label_set_from_data``: the class names were derived from the labels
    themselves (not fixed by the source or the configuration), which makes the
    label set a function of the private records.  ``source_digests``: uint8
    N x 16, the canonical digest of each image as read from its source, set by
    sources that convert, resize or crop while reading
    (:mod:`dpsad.privacy.books.image_digests`); None: the images are as read, up to
    :func:`apply_image_size`.
    """

    images: np.ndarray
    labels: np.ndarray | None
    class_names: list[str]
    test_images: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    notes: dict = field(default_factory=dict)
    label_set_from_data: bool = False
    source_digests: np.ndarray | None = None
    stored_digests: np.ndarray | None = None  # canonical digests of the images as stored (set with the duplicates)
    hashes: np.ndarray | None = None  # perceptual hashes as read, uint64 N x 5 (dpsad.data.near_copies)
    test_hashes: np.ndarray | None = None
    test_digests: np.ndarray | None = None  # canonical digests of the official test images as read


def to_uint8_nhwc(array: np.ndarray, what: str) -> np.ndarray:
    """Return ``array`` as uint8 N x H x W x C, refusing anything ambiguous.

    Accepts uint8 of shape N x H x W or N x H x W x C (C in 1, 3), or floats in
    [0, 1] of those shapes (scaled to 0..255).  NaNs, other ranges and other
    ranks are errors naming ``what``.
    """
    array = np.asarray(array)
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4:
        raise DpsadError(f"{what}: shape {array.shape}, expected N x H x W or N x H x W x C")
    if array.shape[-1] not in (1, 3):
        raise DpsadError(f"{what}: {array.shape[-1]} channels in shape {array.shape}, expected 1 or 3 (channels last)")
    if array.shape[0] == 0:
        raise DpsadError(f"{what}: no images")
    if array.shape[1] != array.shape[2]:
        raise DpsadError(f"{what}: images of {array.shape[1]}x{array.shape[2]}, expected square images "
                         "(crop them to a square first; image_size then resizes)")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if np.issubdtype(array.dtype, np.floating):
        if np.isnan(array).any():
            raise DpsadError(f"{what}: contains NaN values")
        low, high = float(array.min()), float(array.max())
        if low < 0.0 or high > 1.0:
            raise DpsadError(f"{what}: float values in [{low:g}, {high:g}], expected [0, 1] (or uint8)")
        return np.ascontiguousarray(np.round(array * 255.0).astype(np.uint8))
    raise DpsadError(f"{what}: dtype {array.dtype}, expected uint8 or float in [0, 1]")


def resize_square(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 N x H x W x C -> uint8 N x size x size x C (area-averaging Lanczos; square images only)."""
    from PIL import Image

    n, h, w, c = images.shape
    if h != w:
        raise DpsadError(f"images of {h}x{w}, expected square images to resize to image_size {size}")
    if h == size:
        return images
    resized = [np.asarray(Image.fromarray(image[..., 0] if c == 1 else image).resize((size, size), Image.LANCZOS),
                          dtype=np.uint8) for image in images]
    return np.stack(resized).reshape(n, size, size, c)


# The models' range (the schema's image_size values): smaller images have no pixels left after the
# networks' downsampling; larger ones, kept at their size without an image_size, would train a model sized for
# 64 pixels on 256 (17 GB at batch 8 was seen), so they are refused unless image_size says what is wanted.
MIN_IMAGE_SIZE = 8
MAX_NATIVE_SIZE = 64
MAX_CLASSES = 10_000  # class-conditional models embed every class; 10**8 derived from stray labels filled 9 GB


def check_class_count(count: int, what: str) -> None:
    if count > MAX_CLASSES:
        raise DpsadError(f"{what}: {count} classes, expected at most {MAX_CLASSES} (labels are class indices 0 .. K-1)")


def apply_image_size(raw: "RawDataset", size: int | None) -> "RawDataset":
    """Resize the training (and official test) images to ``size`` when it is set and differs.

    Without ``size`` the images keep theirs, which must lie in [MIN_IMAGE_SIZE, MAX_NATIVE_SIZE]."""
    side = int(raw.images.shape[1])
    if side < MIN_IMAGE_SIZE:
        raise DpsadError(f"images of {side}x{side}, expected at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} (the models "
                         "downsample them; set image_size to enlarge them)")
    if not size and side > MAX_NATIVE_SIZE:
        raise DpsadError(f"images of {side}x{side} and no image_size, expected image_size set (16, 28, 32 or 64) "
                         f"for images larger than {MAX_NATIVE_SIZE}x{MAX_NATIVE_SIZE}: the models are sized for those")
    if raw.source_digests is None:
        raw.source_digests = canonical_digests(raw.images)  # as read, before the resize: the same image at any size
    raw.hashes = perceptual_hashes(raw.images)  # as read too: a near-copy at any size
    if raw.test_images is not None:
        raw.test_hashes = perceptual_hashes(raw.test_images)
        raw.test_digests = canonical_digests(raw.test_images)  # a turned copy prepared at any size
    if size:
        raw.images = resize_square(raw.images, int(size))
        if raw.test_images is not None:
            raw.test_images = resize_square(raw.test_images, int(size))
    return raw


def check_labels(labels, n: int, what: str, num_classes: int | None = None) -> np.ndarray:
    """Return ``labels`` as int64 of length ``n`` with values in [0, num_classes)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise DpsadError(f"{what}: shape {labels.shape}, expected ({n},) to match the images")
    if np.issubdtype(labels.dtype, np.floating):
        if np.isnan(labels).any():
            raise DpsadError(f"{what}: contains NaN values")
        if not np.all(labels == np.round(labels)):
            raise DpsadError(f"{what}: non-integer values, expected integer class indices")
    elif not np.issubdtype(labels.dtype, np.integer):
        raise DpsadError(f"{what}: dtype {labels.dtype}, expected integer class indices")
    labels = labels.astype(np.int64)
    if labels.min() < 0:
        raise DpsadError(f"{what}: negative label {labels.min()}, expected values in [0, K)")
    if num_classes is not None and labels.max() >= num_classes:
        raise DpsadError(
            f"{what}: label {labels.max()} out of range, expected values in [0, {num_classes}) for {num_classes} class names"
        )
    return labels


def validate(raw: RawDataset, source: str) -> RawDataset:
    """Check a RawDataset's invariants; raise DpsadError naming the first broken one."""
    raw.images = to_uint8_nhwc(raw.images, f"{source} images")
    n = raw.images.shape[0]
    if raw.labels is not None:
        if not raw.class_names:
            check_class_count(int(np.max(raw.labels)) + 1, f"{source} labels")
            raw.class_names = [str(k) for k in range(int(np.max(raw.labels)) + 1)]
            raw.label_set_from_data = True
        raw.labels = check_labels(raw.labels, n, f"{source} labels", len(raw.class_names))
        empty = sorted(set(range(len(raw.class_names))) - set(np.unique(raw.labels).tolist()))
        if empty:
            shown = ", ".join(f"{k} ({raw.class_names[k]})" for k in empty[:5]) + (", ..." if len(empty) > 5 else "")
            raise DpsadError(f"{source} labels: {len(empty)} of {len(raw.class_names)} classes have no image "
                             f"(label {shown}), expected images of every class (fix num_classes or class_names)")
    if raw.test_images is not None:
        raw.test_images = to_uint8_nhwc(raw.test_images, f"{source} test images")
        if raw.test_images.shape[1:] != raw.images.shape[1:]:
            raise DpsadError(
                f"{source}: test images have shape {raw.test_images.shape[1:]}, expected {raw.images.shape[1:]} like the training images"
            )
        if raw.labels is not None:
            if raw.test_labels is None:
                raise DpsadError(f"{source}: test images have no labels, expected labels like the training images")
            raw.test_labels = check_labels(
                raw.test_labels, raw.test_images.shape[0], f"{source} test labels", len(raw.class_names)
            )
    return raw
