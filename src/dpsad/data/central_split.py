"""The warm-up stage: central images of the private split under the Gaussian mechanism, for a teacher to train on.

See :mod:`dpsad.privacy.mechanism.group_means` for the mechanism and its assumptions.  The noise multiplier is calibrated
so that the one release costs ``central.epsilon`` at the dataset budget's delta; the ledger entry it writes
travels with every teacher, student and run built from the images.
"""

from __future__ import annotations

import secrets

import numpy as np

from ..errors import DpsadError
from ..privacy.mechanism.group_means import augmented, central_images, groups_of_records, members_of_groups, noisy_group_sums, pooled
from ..privacy.books.ledger import make_entry, write_ledger
from ..privacy.books.preparation import stamped
from ..privacy.mechanism.dpsgd import dp_generators
from ..privacy.mechanism.plan import gaussian_release_noise
from .datafile import read_datafile, split_record_digests, write_split_file

SPLIT = "central"


def build_central_images(data_path, out_path, ledger_path, settings: dict, delta: float, log) -> dict:
    """Write ``out_path`` (the ``central`` split: central images and their shifted copies) and its ledger.

    Returns the ledger entry.  ``settings``: the ``central`` section (groups_per_class, resolution,
    clip_norm, epsilon, accountant, augmented_copies, max_shift, seed, noise_seed)."""
    data = read_datafile(data_path, splits=("private",))
    private = data.splits["train"]
    n = len(private)
    if n == 0:
        raise DpsadError("the private split is empty, expected records to compute central images from")
    labels = private.labels if data.labelled else None
    classes = max(data.num_classes, 1) if labels is not None else 1
    per_class = int(settings["groups_per_class"])
    resolution = min(int(settings["resolution"]), data.image_size)
    sigma = gaussian_release_noise(settings["epsilon"], delta, settings["accountant"])
    randomness = dp_generators(settings["noise_seed"])
    key = secrets.randbits(63) if settings["noise_seed"] is None else int(settings["noise_seed"])
    groups = groups_of_records(split_record_digests(data_path, "private"), labels, per_class, key)
    members = members_of_groups(groups, classes * per_class)
    sums = noisy_group_sums(pooled(private.images, resolution), members, clip_norm=settings["clip_norm"],
                            noise_multiplier=sigma, generator=randomness.noise)
    nominal = n / (classes * per_class)
    images = central_images(sums, nominal, data.image_size)
    group_labels = np.repeat(np.arange(classes, dtype=np.int64), per_class)
    images, group_labels = augmented(images, group_labels, int(settings["augmented_copies"]), int(settings["max_shift"]),
                                     int(settings["seed"]))
    entry = make_entry(stage="central_images", private=True, mechanism="gaussian", sample_rate=1.0,
                       noise_multiplier=sigma, steps=1, clip_norm=float(settings["clip_norm"]),
                       noise_seed=randomness.seed_kind,
                       notes=f"{classes * per_class} noisy group means of disjoint groups at {resolution}x{resolution}")
    stamped([entry], data.attrs)
    write_split_file(out_path, SPLIT, images, group_labels if labels is not None else None, data.attrs,
                     ledger_entries=[entry])
    write_ledger(ledger_path, [entry])
    log.info("central images: %d groups of nominal size %.1f at %dx%d, sigma %.3f (epsilon %g at delta %g), "
             "%d training images with the shifted copies", classes * per_class, nominal, resolution, resolution, sigma,
             settings["epsilon"], delta, len(images))
    return entry
