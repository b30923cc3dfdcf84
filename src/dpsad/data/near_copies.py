"""Near-copies of an image are one record: perceptual hashes (``imagehash``'s pHash) within a Hamming distance.

DP-SGD protects one row.  A picture shifted by a pixel, re-encoded as JPEG or with one pixel changed is byte for
byte another image, but it is the same record: kept twice in the private split it is protected at twice the
cost, and in the public split it trains the teacher without noise.  The exact digests
(:mod:`dpsad.privacy.books.records`) cannot see it; a perceptual hash does.

Each image's hash is imagehash's pHash at ``hash_size`` 16 (256 bits: the signs of the 16 x 16 lowest
frequencies of a 64 x 64 DCT; the default 64 bits cannot tell two thin strokes apart) of its greyscale picture
(:func:`dpsad.privacy.books.records.canonical_pixels`) as read, before any resize (``image_size``), moved so that its centre of brightness sits on the middle pixel (pHash alone misses a shift by
one pixel of a small picture), under each of the eight flips and turns, so that a mirrored or turned near-copy is
found too.  pHash drops the mean brightness (two flat squares of any grey hash alike), so it is kept beside the
hash: two images are near-copies when the hash of one is within :data:`THRESHOLD` bits of any of the other's eight
and their mean grey levels differ by at most :data:`MEAN_TOLERANCE`.  The threshold was chosen on the bundled public digits alone (``benchmarks/near_copies.py`` prints the
detection and false-positive rates: docs/PRIVACY.md).

Cost: about 4 ms an image to hash (eight turns), and every pair is compared (numpy's popcount): seconds for the
demo, minutes for MNIST's 60,000 and more than an hour for CelebA's 200,000, once, in ``prepare_data``.

Privacy: the hashes are computed from the private records without noise; they stay in ``data.h5`` (the curator's).
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..privacy.books.records import DIGEST_BYTES, canonical_pixels

HASH_SIZE = 16  # imagehash's hash_size: 16 x 16 = 256 bits
THRESHOLD = 16  # bits of 256 (chosen on the public font digits: benchmarks/near_copies.py)
WORDS = HASH_SIZE * HASH_SIZE // 64  # uint64 words a hash; one more holds 16 x the mean grey level
MEAN_TOLERANCE = 4  # grey levels of 255 (a shift, a re-encoding or a changed pixel moves the mean by less than 1)
STEP = 1 << 24  # uint64 words compared at once (128 MiB)


def _turns(image: np.ndarray) -> list[np.ndarray]:
    """The eight flips and turns of ``image`` [H, W]."""
    return [np.rot90(view, k) for view in (image, image.T) for k in range(4)]


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
    """pHash of each image, centred, under its eight flips and turns: uint8 [N, H, W, C] (or a list of images)
    -> uint64 [N, 8, WORDS + 1] (turn 0: as is; the last word: 16 x the mean grey level)."""
    import imagehash  # with scipy: only prepare_data pays for the import
    from PIL import Image

    out = np.zeros((len(images), 8, WORDS + 1), dtype=np.uint64)
    for i, image in enumerate(images):
        grey = centred(canonical_pixels(image)[..., 0])
        out[i, :, WORDS] = int(round(16 * float(grey.mean())))
        for k, view in enumerate(_turns(grey)):
            bits = imagehash.phash(Image.fromarray(np.ascontiguousarray(view)), hash_size=HASH_SIZE).hash.reshape(-1)
            out[i, k, :WORDS] = np.packbits(bits).view(">u8")
    return out


def hash_digests(hashes: np.ndarray) -> np.ndarray:
    """A digest of each image's smallest hash over its turns and its mean grey level in steps of 8, uint64
    [N, 8, WORDS + 1] -> uint8 [N, 16]: the same for a near-copy whose hash is equal (a shift by a pixel of a
    picture on a plain background, most single changed pixels), by which the curator's record recognises it in
    another release as it does an identical image (:mod:`dpsad.privacy.books.records`)."""
    out = np.empty((len(hashes), DIGEST_BYTES), dtype=np.uint8)
    for i, turns in enumerate(np.asarray(hashes, dtype=np.uint64)):
        smallest = min(turn[:WORDS].astype(">u8").tobytes() for turn in turns) + bytes([int(turns[0, WORDS]) // 128])
        out[i] = np.frombuffer(hashlib.blake2b(b"dpsad phash " + smallest, digest_size=DIGEST_BYTES).digest(), np.uint8)
    return out


def near(hashes: np.ndarray, others: np.ndarray, threshold: int = THRESHOLD, *, earlier_only: bool = False) -> np.ndarray:
    """Boolean [N]: row i of ``hashes`` (uint64 [N, 8, WORDS + 1]) is a near-copy of some row of ``others``
    (uint64 [M, 8, WORDS + 1]) under some turn; with ``earlier_only`` (``others`` is ``hashes``), of an earlier row."""
    found = np.zeros(len(hashes), dtype=bool)
    if not len(hashes) or not len(others):
        return found
    block = max(1, STEP // (len(others) * 8 * WORDS))
    their_mean = others[:, 0, WORDS].astype(np.int64)
    for start in range(0, len(hashes), block):
        rows = hashes[start:start + block, :1, :WORDS]  # [B, 1, WORDS]: each row as is, against every turn of the others
        distance = np.bitwise_count(rows[:, None] ^ others[None, :, :, :WORDS]).sum(axis=3, dtype=np.int32).min(axis=2)
        mean = hashes[start:start + block, 0, WORDS].astype(np.int64)
        close = (distance <= threshold) & (np.abs(mean[:, None] - their_mean[None]) <= 16 * MEAN_TOLERANCE)
        if earlier_only:
            close &= np.arange(len(others))[None, :] < np.arange(start, start + len(rows))[:, None]
        found[start:start + len(rows)] = close.any(axis=1)
    return found
