"""Which records a split holds, by content: one digest per image, and one fingerprint per set of images.

A privacy budget belongs to the private records, not to a dataset's name.  ``prepare_data`` stores two
digests of every image of the private and public splits in ``data.h5`` (uint8 N x 16 each):
``<split>/record_digests``, of the image as stored (after ``image_size`` was applied), and
``<split>/source_digests``, of the image as read from its source, before any resize or crop.  The
fingerprint of each stored set is a root attribute (``private_records_sha256``,
``public_records_sha256``).  Two datasets over the same records have the same fingerprint whatever
they are called; two that share only some records share those digests; the same source images
prepared at two ``image_size`` values share their source digests (:func:`identity_digests`).

What is detected: the same image, pixel for pixel, as stored or as read from its source.  What is not
(:data:`NOT_DETECTED`).  A record is its image: the same image under another label is the same record
(conservative: it composes rather than passes).

Privacy: digests identify the private records exactly.  They stay with the curator (``data.h5`` and
the curator's release record); nothing in ``release/`` carries them.
"""

from __future__ import annotations

import hashlib

import numpy as np

DIGEST_BYTES = 16  # 128 bits: no accidental collision among any number of records a curator will hold
DIGESTS = "record_digests"
SOURCE_DIGESTS = "source_digests"
NOT_DETECTED = ("A record is recognised in another release only when its image is identical, pixel for pixel, as "
                "stored or as read from its source before resizing; a crop, shift, re-encoding or other resampling "
                "of it, or another picture of the same person or object, counts as a new record and is not composed.")


def record_digests(images: np.ndarray) -> np.ndarray:
    """Digest of each image.  images uint8 [N, H, W, C] -> uint8 [N, DIGEST_BYTES]."""
    images = np.ascontiguousarray(images)
    header = np.asarray(images.shape[1:], dtype=np.int64).tobytes()
    out = np.empty((len(images), DIGEST_BYTES), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = np.frombuffer(hashlib.blake2b(header + image.tobytes(), digest_size=DIGEST_BYTES).digest(), np.uint8)
    return out


def set_fingerprint(digests: np.ndarray) -> str:
    """sha256 of the sorted digests: the same for the same records in any order (hex string)."""
    rows = sorted(bytes(row) for row in np.asarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES))
    return hashlib.sha256(b"".join(rows)).hexdigest()


def as_set(digests: np.ndarray) -> set[bytes]:
    """The digests as a set of bytes, for intersections."""
    return {bytes(row) for row in np.asarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)}


def stable_seed(digest: np.ndarray | bytes, seed: int) -> int:
    """A 63-bit seed from one record's digest and a configured seed: a draw for that record that does not
    depend on which other records are present or where it sits in the split."""
    value = int.from_bytes(bytes(digest)[:8], "little") ^ (int(seed) * 0x9E3779B97F4A7C15)
    return value & 0x7FFF_FFFF_FFFF_FFFF


def identity_digests(stored: np.ndarray, source: np.ndarray | None) -> np.ndarray:
    """The digests by which a set's records are recognised: those of the stored images and those of the images
    as read from their source, each once.  uint8 [N, 16] and [N, 16] or None -> uint8 [M, 16], M <= 2N."""
    stored = np.asarray(stored, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    both = stored if source is None else np.concatenate([stored, np.asarray(source, np.uint8).reshape(-1, DIGEST_BYTES)])
    return np.unique(both, axis=0) if len(both) else both
