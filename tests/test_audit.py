"""The one-run privacy audit: the bound, gradient canaries through DPSGD, canaries in the data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsad.audit.bound import (
    epsilon_for,
    epsilon_lower_bound,
    gaussian_mechanism_epsilon,
    guesses_from_scores,
    idealised_gaussian_bound,
    p_value,
)
from dpsad.audit.canaries import canary_images, draw_membership, with_canaries
from dpsad.audit.gradient import gradient_canary_scores
from dpsad.privacy.accounting import SGMComponent, Accountant, shared_batch_sigma
from dpsad.privacy.mechanism.dpsgd import CLIP_MARGIN

DEMO_Q, DEMO_STEPS = 64 / 3600, 113  # the demo's student: batch 64 of 3,600 records, 2 epochs


def test_all_guesses_right_matches_the_closed_form():
    # With delta = 0 and v = r the p-value is p^r, so eps_LB = logit(alpha^(1/r)).
    for r in (10, 100, 500):
        p = 0.05 ** (1 / r)
        assert epsilon_for(1000, r, r, 0.0, 0.05) == pytest.approx(math.log(p / (1 - p)), rel=1e-9)


def test_the_largest_reachable_bound_is_the_best_guess_count_with_every_guess_right():
    from dpsad.audit.bound import default_guess_counts, largest_reachable_bound
    from dpsad.audit.canaries import draw_membership

    included = draw_membership(1000, 0)
    choices = default_guess_counts(1000)
    by_hand = max(epsilon_for(1000, kp + km, kp + km, 1e-5, 0.05 / len(choices)) for kp, km in choices
                  if kp <= included.sum() and km <= (~included).sum())
    reachable = largest_reachable_bound(included, 1e-5)
    assert reachable == pytest.approx(by_hand) and 4.0 < reachable < 5.0
    assert largest_reachable_bound(draw_membership(200, 0), 1e-5) < reachable  # fewer canaries, less to show


def test_p_value_grows_with_epsilon_and_the_delta_term_costs_something():
    values = [p_value(1000, 200, 150, eps, 1e-5) for eps in (0.0, 0.5, 1.0, 2.0)]
    assert values == sorted(values) and values[0] < 1e-3
    assert p_value(1000, 200, 150, 1.0, 1e-5) > p_value(1000, 200, 150, 1.0, 0.0)
    with pytest.raises(ValueError, match="expected 0 <= v <= r <= m"):
        p_value(10, 5, 6, 1.0, 0.0)


def test_the_bound_is_valid_for_randomized_response():
    # eps0-DP randomized response: each guess right with probability e^eps0 / (1 + e^eps0).
    # A valid 95% bound exceeds eps0 in at most 5% of runs; it should also come close to eps0.
    rng = np.random.default_rng(1)
    eps0, r = 1.0, 1000
    right = rng.binomial(r, 1 / (1 + math.exp(-eps0)), size=2000)
    counts, index = np.unique(right, return_inverse=True)  # each count's bound once (about 100 distinct counts)
    bounds = np.array([epsilon_for(r, r, int(v), 0.0, 0.05) for v in counts])[index]
    assert (bounds > eps0).mean() <= 0.05 + 0.015
    assert np.median(bounds) > eps0 - 0.3


def test_idealised_gaussian_canaries():
    # Scores N(shift, 1) in, N(0, 1) out, m = 1000, delta 1e-5, at expected counts.  These are our own
    # figures (the paper's table is not in this repository); each is below the Gaussian mechanism's true epsilon.
    bounds = {shift: idealised_gaussian_bound(1000, shift, 1e-5) for shift in (1, 2, 4)}
    assert bounds[1] == pytest.approx(1.314, abs=1e-3)
    assert bounds[2] == pytest.approx(2.875, abs=1e-3)
    assert bounds[4] == pytest.approx(4.475, abs=1e-3)
    for shift, bound in bounds.items():
        assert bound < gaussian_mechanism_epsilon(shift, 1e-5)


def test_sampled_gaussian_scores_stay_below_the_true_epsilon():
    rng = np.random.default_rng(0)
    for shift in (0.5, 2.0):
        truth = gaussian_mechanism_epsilon(shift, 1e-5)
        for seed in range(5):
            included = draw_membership(1000, seed)
            scores = rng.normal(size=1000) + shift * included
            assert epsilon_lower_bound(scores, included, 1e-5).epsilon_lb <= truth


def test_guesses_use_both_ends_of_the_ranking():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    included = np.array([True, True, False, True, False, False])
    assert guesses_from_scores(scores, included, 2, 2) == (4, 4)
    assert guesses_from_scores(scores, included, 3, 0) == (2, 3)
    with pytest.raises(ValueError, match="finite"):
        epsilon_lower_bound(np.array([np.nan, 1.0]), np.array([True, False]), 1e-5)


def test_a_noise_free_mechanism_is_caught_by_gradient_canaries():
    # The run claims eps ~1 (sigma calibrated for it) but its engine adds no noise.
    included = draw_membership(1000, 3)
    claimed = Accountant("pld").epsilon([SGMComponent(1.1241, DEMO_Q, DEMO_STEPS)], 1e-5)
    assert claimed == pytest.approx(1.0, abs=0.01)
    scores = gradient_canary_scores(included, sample_rate=DEMO_Q, steps=DEMO_STEPS, noise_multipliers=[0.0],
                                    clip_norm=1.0, expected_batch_size=64, noise_seed=0)
    assert epsilon_lower_bound(scores, included, 1e-5).epsilon_lb > 2.5 * claimed


def test_gradient_canaries_measure_the_clipped_count_of_appearances():
    included = draw_membership(200, 5)
    scores = gradient_canary_scores(included, sample_rate=0.2, steps=30, noise_multipliers=[0.0], clip_norm=3.0,
                                    expected_batch_size=10.0, noise_seed=1)
    assert np.all(scores[~included] == 0)
    # each appearance adds the clipped contribution, C(1 - CLIP_MARGIN), scaled back by C: a whole count each
    assert np.allclose(scores, np.round(scores), rtol=3 * CLIP_MARGIN, atol=0)
    assert scores[included].mean() == pytest.approx(0.2 * 30, rel=0.15)


@pytest.mark.parametrize("sigmas", [[1.1241], [0.489], [0.5467, 1.0935]])
def test_sound_noise_keeps_the_gradient_audit_below_the_accounted_epsilon(sigmas):
    included = draw_membership(1000, 4)
    accounted = Accountant("pld").epsilon([SGMComponent(shared_batch_sigma(sigmas), DEMO_Q, DEMO_STEPS)], 1e-5)
    scores = gradient_canary_scores(included, sample_rate=DEMO_Q, steps=DEMO_STEPS, noise_multipliers=sigmas,
                                    clip_norm=1.0, expected_batch_size=64)
    assert epsilon_lower_bound(scores, included, 1e-5).epsilon_lb <= accounted


def test_canaries_join_only_the_private_split(tmp_path):
    from dpsad.data.datafile import PreparedData, Split

    rng = np.random.default_rng(0)
    split = lambda n: Split(rng.integers(0, 255, (n, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, n))  # noqa: E731
    data = PreparedData(splits={"train": split(30), "public": split(5), "test": split(5)}, class_names=list("0123456789"),
                        labelled=True, image_size=28, channels=1, attrs={"n_train": 30})
    images, labels = canary_images(20, 28, 1, 10, seed=0)
    assert images.shape == (20, 28, 28, 1) and images.dtype == np.uint8 and labels.max() < 10
    assert len({img.tobytes() for img in images}) == 20
    included = draw_membership(20, 0)
    out = with_canaries(data, images, labels, included)
    assert len(out.splits["train"]) == 30 + included.sum() and out.attrs["n_train"] == 30 + included.sum()
    assert np.array_equal(out.splits["train"].images[30:], images[included])
    assert out.splits["public"] is data.splits["public"] and len(data.splits["train"]) == 30


def test_audit_refuses_runs_it_cannot_audit_soundly():
    from dpsad.audit.pipeline import audit_run
    from dpsad.errors import DpsadError

    common = dict(data=None, settings={}, inputs={}, params={"labels": True}, device="cpu", work_parent=".", log=None)
    with pytest.raises(DpsadError, match="method 'nonprivate', expected one of dpsad, dpdm, dpgan"):
        audit_run(method="nonprivate", run={"name": "nonprivate", "delta": 1e-5},
                  audit={"canaries": 1000, "seed": 0}, **common)
    with pytest.raises(DpsadError, match="canaries \\* delta = 1, expected well below 1"):
        audit_run(method="dpsad", run={"name": "x", "delta": 1e-3}, audit={"canaries": 1000, "seed": 0}, **common)
