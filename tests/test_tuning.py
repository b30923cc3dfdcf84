"""Defaults are chosen on public data: the tuning scores read no private and no test record."""

from __future__ import annotations

import logging

import numpy as np

from conftest import image_ids, indexed_images
from dpsad.data.datafile import PreparedData, Split
from dpsad.evaluation.tuning import PublicScorer, public_halves, public_only

SETTINGS = {"evaluator_epochs": 2, "classifier_epochs": 2, "lr": 1e-3, "batch_size": 16, "classifier_batch_size": 16,
            "holdout_fraction": 0.25, "seed": 0}


def data_with(private_seed: int, test_seed: int) -> PreparedData:
    public = indexed_images(40, size=12, seed=5)
    public[:, 0, 0, 0] += 100  # ids 100..139: apart from the other splits' ids
    return PreparedData(
        splits={"train": Split(indexed_images(30, size=12, seed=private_seed), np.arange(30) % 2),
                "public": Split(public, np.arange(40) % 2),
                "test": Split(indexed_images(10, size=12, seed=test_seed), np.arange(10) % 2)},
        class_names=["a", "b"], labelled=True, image_size=12, channels=1, attrs={"seed": 0})


def test_the_public_view_holds_only_public_images_in_two_disjoint_halves():
    data = data_with(1, 2)
    fit, held = public_halves(data)
    assert image_ids(fit.images).isdisjoint(image_ids(held.images))
    assert image_ids(fit.images) | image_ids(held.images) == set(range(100, 140))
    view = public_only(data)
    for split in view.splits.values():
        assert image_ids(split.images) <= set(range(100, 140))


def test_public_scores_do_not_move_when_the_private_and_test_splits_change():
    rng = np.random.default_rng(0)
    samples, labels = rng.integers(0, 256, (20, 12, 12, 1), dtype=np.uint8), np.arange(20) % 2
    log = logging.getLogger("test")
    first = PublicScorer(data_with(1, 2), SETTINGS, log)(samples, labels)
    second = PublicScorer(data_with(7, 9), SETTINGS, log)(samples, labels)
    assert first == second
    assert set(first) == {"class_fidelity_public", "acc_logreg_public", "acc_mlp_public", "acc_cnn_public"}
