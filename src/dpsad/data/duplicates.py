"""One row per record: identical images and near-copies are removed before the data is split.

DP-SGD protects one row: an image present twice is two rows, and a record that is in the private split
and in a public one is used without noise.  So ``prepare_data`` keeps one copy of each image, recognised by
its canonical digests as read and as stored (:func:`dpsad.privacy.books.image_digests.canonical_digest`: the same picture,
also mirrored or turned, in colour or greyscale, whatever ``channels`` or ``image_size`` say), and

- in the source's own pool (private, public fraction and test split alike), keeps the first copy of each
  image, so no image can sit in two splits of the same source or twice in the private split;
- drops from the private split every image that is also in a separate public source (it is public);
- drops from an official test split every image identical to a private record (evaluation only, but a
  test image that is a training record inflates the curator's figures);
- and the same for near-copies: a picture shifted, re-encoded or slightly changed
  (:mod:`dpsad.data.near_copies`).

The counts go to ``data.h5`` (attribute ``duplicates_removed``) and the stage's log, both the curator's.  A
release states n, the number of distinct private records (treated as public, as DP releases usually do), which
tells with the source's size how many copies went.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from ..privacy.books.image_digests import as_set


@dataclass(frozen=True)
class RemovedDuplicates:
    """How many images ``prepare_data`` removed, by reason."""

    repeated_in_source: int = 0      # further copies of an image of the source's own pool
    private_in_public_source: int = 0  # private images that the separate public source also holds
    test_identical_to_private: int = 0  # official test images identical to a private record
    near_copies_in_source: int = 0  # near-copies (dpsad.data.near_copies) of an earlier image of the pool
    private_near_public_source: int = 0  # private images near an image of the separate public source
    test_near_private: int = 0  # official test images near a private record
    private_bundled_digits: int = 0  # private images that are bundled MNIST-5k digits (data.<name>.without_bundled_digits)

    def counts(self) -> tuple[int, ...]:
        return tuple(asdict(self).values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def summary(self) -> str:
        return (f"{self.repeated_in_source} repeated image(s) and {self.near_copies_in_source} near-copies of the "
                f"source, {self.private_in_public_source} private image(s) also in the public source and "
                f"{self.private_near_public_source} near one of it, {self.test_identical_to_private} test image(s) "
                f"identical to a private record and {self.test_near_private} near one removed"
                + (f", and {self.private_bundled_digits} bundled MNIST-5k digit(s) left out of the private split"
                   if self.private_bundled_digits else ""))


def first_copies(keys: list[np.ndarray]) -> np.ndarray:
    """Indices of the rows that are no copy of an earlier row, in order: a row is a copy when any of its keys
    (each kind uint8 [N, 16]) is a key of an earlier row that was kept or dropped.  -> int64 [M], M <= N."""
    seen: set[bytes] = set()
    keep = []
    for i in range(len(keys[0]) if keys else 0):
        row = [bytes(kind[i]) for kind in keys]
        if not any(key in seen for key in row):
            keep.append(i)
        seen.update(row)
    return np.asarray(keep, dtype=np.int64)


def rows_not_in(keys: list[np.ndarray], others: list[np.ndarray]) -> np.ndarray:
    """Boolean [N]: rows none of whose keys (each uint8 [N, 16]) is among ``others`` (uint8 [M_k, 16] each)."""
    known = set().union(*(as_set(o) for o in others if o is not None)) if others else set()
    n = len(keys[0]) if keys else 0
    return np.array([not any(bytes(k[i]) in known for k in keys if k is not None) for i in range(n)], dtype=bool)
