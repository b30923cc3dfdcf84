"""Which records a split holds, by content: digests of every image, and one fingerprint per set of images.

A privacy budget belongs to the private records, not to a dataset's name or to a setting.  ``prepare_data``
stores three digests of every image of the private and public splits in ``data.h5`` (uint8 N x 16 each):

- ``<split>/source_digests``: the image's *canonical form as read* (:func:`canonical_digests`), taken on the
  decoded pixels before any mode conversion (``channels``), resize (``image_size``) or crop;
- ``<split>/canonical_digests``: the canonical form of the image as stored;
- ``<split>/record_digests``: the image as stored, byte for byte (:func:`record_digests`; the digests of
  earlier versions, by which their record sets are still recognised, and the per-record seeds).

The canonical form is the smallest digest over the eight flips and rotations of the picture's greyscale form
(:func:`canonical_pixels`: alpha dropped, 16 bits scaled to 8, colour reduced to luma): the same picture read as
L or RGB, with or without transparency, at 8 or 16 bits, mirrored or turned by a multiple of 90 degrees is one
record.
The fingerprint of each stored set is a root attribute (``private_records_sha256``, ``public_records_sha256``).
Two datasets over the same records share digests whatever they are called and whatever their settings.

What is still not detected (:data:`NOT_DETECTED`).  A record is its image: the same image under another label
is the same record (conservative: it composes rather than passes).

Privacy: digests identify the private records exactly.  They stay with the curator (``data.h5`` and the
curator's record); nothing in ``release/`` carries them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

DIGEST_BYTES = 16  # 128 bits: no accidental collision among any number of records a curator will hold
DIGESTS = "record_digests"
SOURCE_DIGESTS = "source_digests"
CANONICAL_DIGESTS = "canonical_digests"
NOT_DETECTED = ("A record is recognised in another release when its image is identical, pixel for pixel, to one "
                "used there, as stored or as read from its source (before any resizing), also when mirrored, turned "
                "by a multiple of 90 degrees, or stored in colour, greyscale, 16 bits or with transparency, and when "
                "its perceptual hash (pHash of the centred picture) and brightness equal one used there, as they do "
                "for most digit-like pictures shifted by a pixel or with a pixel changed; a crop, a re-encoding with "
                "loss, a shifted photograph, a larger change, or another picture of the same person or object, "
                "counts as a new record and is not composed.")


def _digest(header: bytes, pixels: np.ndarray) -> bytes:
    return hashlib.blake2b(header + np.ascontiguousarray(pixels).tobytes(), digest_size=DIGEST_BYTES).digest()


def record_digests(images: np.ndarray) -> np.ndarray:
    """Digest of each image, byte for byte.  images uint8 [N, H, W, C] -> uint8 [N, DIGEST_BYTES]."""
    images = np.ascontiguousarray(images)
    header = np.asarray(images.shape[1:], dtype=np.int64).tobytes()
    out = np.empty((len(images), DIGEST_BYTES), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = np.frombuffer(_digest(header, image), np.uint8)
    return out


def canonical_pixels(image: np.ndarray) -> np.ndarray:
    """One image [H, W] or [H, W, C] (C in 1..4; uint8, or uint16 for 16-bit greyscale) as the uint8 [H, W, 1]
    greyscale picture every setting of this workflow could make of it: the alpha channel dropped (converting to
    L or RGB drops it), 16-bit values scaled to 8 bits as the readers do, colour reduced to luma by Pillow's own
    integer formula (ITU-R 601-2, what ``convert("L")`` computes).  Two pictures that differ only in colour, in
    transparency or in bit depth are the same record: the safe side."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 2, 3, 4):
        raise ValueError(f"an image of shape {image.shape}, expected H x W or H x W x C with C in 1..4")
    if image.shape[-1] in (2, 4):
        image = image[..., :-1]
    if image.dtype != np.uint8:
        if not np.issubdtype(image.dtype, np.integer) or image.max(initial=0) > 65535 or image.min(initial=0) < 0:
            raise ValueError(f"an image of dtype {image.dtype}, expected 8- or 16-bit integers")
        image = np.round(image.astype(np.float64) / 257.0).astype(np.uint8)  # as the readers scale 16 bits
    if image.shape[-1] == 3:
        rgb = image.astype(np.uint32)
        image = ((rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16).astype(np.uint8)
        image = image[..., None]
    return image


TURN_CHUNK = 4096  # images turned at once: one view of them in grey is 16 MiB at 64 x 64, 160 MB at 218 x 178


def _smallest_turned_digests(pixels: np.ndarray) -> np.ndarray:
    """The smallest digest over the eight flips and rotations of each image: uint8 [N, H, W, C] -> uint8
    [N, DIGEST_BYTES].  Each view is digested with its own shape as header, as one image turned alone would be."""
    out = np.empty((len(pixels), DIGEST_BYTES), dtype=np.uint8)
    for start in range(0, len(pixels), TURN_CHUNK):
        chunk = pixels[start:start + TURN_CHUNK]
        smallest = [b"\xff" * (DIGEST_BYTES + 1)] * len(chunk)
        for turned in (chunk, np.transpose(chunk, (0, 2, 1, 3))):  # the transpose and four turns give all eight
            for k in range(4):
                view = np.ascontiguousarray(np.rot90(turned, k, axes=(1, 2)))
                header = np.asarray(view.shape[1:], dtype=np.int64).tobytes()
                smallest = [min(best, _digest(header, image)) for best, image in zip(smallest, view)]
        out[start:start + len(chunk)] = np.frombuffer(b"".join(smallest), np.uint8).reshape(-1, DIGEST_BYTES)
    return out


def canonical_digest(image: np.ndarray) -> bytes:
    """The smallest digest over the eight flips and rotations of :func:`canonical_pixels` (``DIGEST_BYTES`` bytes)."""
    return bytes(_smallest_turned_digests(canonical_pixels(image)[None])[0])


def canonical_digests(images) -> np.ndarray:
    """:func:`canonical_digest` of each image of ``images`` (an [N, H, W, C] array or a list of images)
    -> uint8 [N, DIGEST_BYTES].  An array is reduced to greyscale in one pass."""
    if isinstance(images, np.ndarray) and images.ndim == 4 and len(images):
        flat = canonical_pixels(images.reshape(-1, images.shape[2], images.shape[3]))  # [N*H, W, 1]
        return _smallest_turned_digests(flat.reshape(len(images), images.shape[1], images.shape[2], 1))
    out = np.empty((len(images), DIGEST_BYTES), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = np.frombuffer(canonical_digest(image), np.uint8)
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


def identity_digests(*digests: np.ndarray | None) -> np.ndarray:
    """The digests by which a set's records are recognised: every digest kind given (each uint8 [N, 16], None for
    a kind a file lacks), each once.  -> uint8 [M, 16], M <= the number given."""
    present = [np.asarray(d, np.uint8).reshape(-1, DIGEST_BYTES) for d in digests if d is not None]
    both = np.concatenate(present) if present else np.zeros((0, DIGEST_BYTES), np.uint8)
    return np.unique(both, axis=0) if len(both) else both


@dataclass
class RecordSets:
    """The private and public record digests of one prepared dataset (uint8 M x 16 each, every identity digest
    once) and, to count records rather than digests, each digest kind row by row (a list of uint8 N x 16; None:
    count digests)."""

    dataset: str
    private: np.ndarray
    public: np.ndarray
    private_rows: list[np.ndarray] | None = None
    public_rows: list[np.ndarray] | None = None
    private_fingerprint: str = field(init=False)
    public_fingerprint: str = field(init=False)

    def __post_init__(self):
        self.private_fingerprint = set_fingerprint(self.private)
        self.public_fingerprint = set_fingerprint(self.public)


def records_among(digests: np.ndarray, rows: list[np.ndarray] | None, known: set[bytes]) -> int:
    """How many records of a split are in ``known``: rows any of whose digest kinds is there (digests when
    ``rows`` is None)."""
    if rows is None:
        return len(as_set(digests) & known)
    return int(rows_among(rows, known).sum())


def rows_among(rows: list[np.ndarray], known: set[bytes]) -> np.ndarray:
    """bool N: which of N records, given by their digest kinds row by row (each uint8 N x 16), have a digest of any
    kind in ``known``."""
    hit = np.zeros(len(rows[0]) if rows else 0, dtype=bool)
    for kind in rows:
        hit |= np.fromiter((bytes(d) in known for d in kind), dtype=bool, count=len(hit))
    return hit
