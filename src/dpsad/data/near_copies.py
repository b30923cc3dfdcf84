"""Near-copies of an image are one record: perceptual hashes (``imagehash``'s pHash) within a Hamming distance.

DP-SGD protects one row.  A picture shifted by a pixel, re-encoded as JPEG or with one pixel changed is byte for
byte another image, but it is the same record: kept twice in the private split it is protected at twice the
cost, and in the public split it trains the teacher without noise.  The exact digests
(:mod:`dpsad.privacy.books.image_digests`) cannot see it; a perceptual hash does.

Each image's hash is imagehash's pHash at ``hash_size`` 16 (256 bits: the signs of the 16 x 16 lowest
frequencies of a 64 x 64 DCT; the default 64 bits cannot tell two thin strokes apart) of its greyscale picture
(:func:`dpsad.privacy.books.image_digests.canonical_pixels`) as read, before any resize (``image_size``), moved so that
its centre of brightness sits on the middle pixel (pHash alone misses a shift by one pixel of a small picture).
pHash drops the mean brightness (two flat squares of any grey hash alike), so it is kept beside the hash: two
images are near-copies when their hashes are within :data:`THRESHOLD` bits and their mean grey levels differ by
at most :data:`MEAN_TOLERANCE`, or when their :func:`hash_digests` are equal (``prepare_data`` takes both).
Mirrored and turned copies are found by the exact digests, which take the smallest over the eight flips and turns
as read; a copy both turned and changed is not found.  The threshold was
chosen on the bundled public glyphs alone (``benchmarks/near_copies.py`` prints the detection and false-positive
rates: docs/PRIVACY.md).

Cost: about 0.3 ms an image to hash, and every pair whose mean grey levels are within the tolerance is compared
(numpy's popcount), once, in ``prepare_data``.

Privacy: the hashes are computed from the private records without noise; they stay in ``data.h5`` (the curator's).
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..privacy.books.image_digests import DIGEST_BYTES, canonical_pixels

HASH_SIZE = 16  # imagehash's hash_size: 16 x 16 = 256 bits
THRESHOLD = 16  # bits of 256 (chosen on the public font digits: benchmarks/near_copies.py)
WORDS = HASH_SIZE * HASH_SIZE // 64  # uint64 words a hash; one more holds 16 x the mean grey level
MEAN_TOLERANCE = 4  # grey levels of 255 (a shift, a re-encoding or a changed pixel moves the mean by less than 1)
STEP = 1 << 24  # uint64 words compared at once (128 MiB)


def centred(grey: np.ndarray) -> np.ndarray:
    """``grey`` [H, W] rolled by whole pixels so that its centre of brightness is the middle pixel."""
    total = grey.sum(dtype=np.float64)
    if total == 0:
        return grey
    rows, cols = np.indices(grey.shape)
    shift = [int(round((size - 1) / 2 - (grey * where).sum(dtype=np.float64) / total))
             for size, where in zip(grey.shape, (rows, cols))]
    return np.roll(grey, shift, axis=(0, 1))


def perceptual_hashes(images) -> np.ndarray:
    """pHash of each image, centred, and its mean grey level: uint8 [N, H, W, C] (or a list of images)
    -> uint64 [N, WORDS + 1] (the last word: 16 x the mean grey level)."""
    import imagehash  # with scipy: only prepare_data pays for the import
    from PIL import Image

    out = np.zeros((len(images), WORDS + 1), dtype=np.uint64)
    for i, image in enumerate(images):
        grey = centred(canonical_pixels(image)[..., 0])
        bits = imagehash.phash(Image.fromarray(np.ascontiguousarray(grey)), hash_size=HASH_SIZE).hash.reshape(-1)
        out[i, :WORDS] = np.packbits(bits).view(">u8")
        out[i, WORDS] = int(round(16 * float(grey.mean())))
    return out


def hash_digests(hashes: np.ndarray) -> np.ndarray:
    """A digest of each image's hash and its mean grey level in steps of 8, uint64 [N, WORDS + 1] -> uint8 [N, 16]:
    the same for a near-copy whose hash is equal (a shift by a pixel of a picture on a plain background, most
    single changed pixels), by which the curator's record recognises it in another release as it does an
    identical image (:mod:`dpsad.privacy.books.image_digests`)."""
    out = np.empty((len(hashes), DIGEST_BYTES), dtype=np.uint8)
    for i, row in enumerate(np.asarray(hashes, dtype=np.uint64)):
        key = row[:WORDS].astype(">u8").tobytes() + bytes([int(row[WORDS]) // 128])
        out[i] = np.frombuffer(hashlib.blake2b(b"dpsad phash " + key, digest_size=DIGEST_BYTES).digest(), np.uint8)
    return out


def near(hashes: np.ndarray, others: np.ndarray, threshold: int = THRESHOLD, *, earlier_only: bool = False) -> np.ndarray:
    """Boolean [N]: row i of ``hashes`` (uint64 [N, WORDS + 1]) is a near-copy of some row of ``others`` (uint64
    [M, WORDS + 1]); with ``earlier_only`` (``others`` is ``hashes``), of an earlier row.

    Only pairs whose mean grey levels are within the tolerance can be near-copies, so both sides are taken in the
    order of their means and each block of rows is compared with the window of ``others`` its means can reach:
    the same answer as comparing every pair, at a fraction of the pairs."""
    found = np.zeros(len(hashes), dtype=bool)
    if not len(hashes) or not len(others):
        return found
    block = max(1, STEP // (len(others) * WORDS))
    their_mean = others[:, WORDS].astype(np.int64)
    their_order = np.argsort(their_mean, kind="stable")
    their_sorted_mean = their_mean[their_order]
    my_mean = hashes[:, WORDS].astype(np.int64)
    my_order = np.argsort(my_mean, kind="stable")
    tolerance = 16 * MEAN_TOLERANCE
    for start in range(0, len(hashes), block):
        mine = my_order[start:start + block]
        low = np.searchsorted(their_sorted_mean, my_mean[mine[0]] - tolerance, side="left")
        high = np.searchsorted(their_sorted_mean, my_mean[mine[-1]] + tolerance, side="right")
        theirs = their_order[low:high]
        if not len(theirs):
            continue
        rows, candidates = hashes[mine], others[theirs]
        distance = np.bitwise_count(rows[:, None, :WORDS] ^ candidates[None, :, :WORDS]).sum(axis=2, dtype=np.int32)
        close = (distance <= threshold) & (np.abs(my_mean[mine][:, None] - their_mean[theirs][None]) <= tolerance)
        if earlier_only:
            close &= theirs[None, :] < mine[:, None]
        found[mine] = close.any(axis=1)
    return found
