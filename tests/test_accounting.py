"""Accounting: golden values, an independent accountant, calibration, and the ledger's verdict."""

from __future__ import annotations

import math

import pytest

from dpsad.errors import PrivacyError
from dpsad.privacy.accounting import SGMComponent, calibrate_noise, compose_epsilon, steps_for_epochs
from dpsad.privacy.ledger import epsilon_curve, make_entry, verdict

MNIST_Q = 128 / 60000
MNIST_STEPS = 46875


@pytest.mark.parametrize("sigma, rdp, prv", [(1.9, 1.067, 0.986), (0.6, 10.51, 9.491)])
def test_golden_epsilons(sigma, rdp, prv):
    comp = [SGMComponent(sigma, MNIST_Q, MNIST_STEPS)]
    assert compose_epsilon(comp, 1e-5, "rdp") == pytest.approx(rdp, rel=0.01)
    assert compose_epsilon(comp, 1e-5, "prv") == pytest.approx(prv, rel=0.01)


def pld_epsilon(sigma, q, steps, delta):
    """Google's dp-accounting PLD accountant: an implementation independent of Opacus."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    return accountant.compose(event).get_epsilon(delta)


@pytest.mark.parametrize("sigma", [1.9, 0.6])
def test_prv_agrees_with_an_independent_pld_accountant(sigma):
    ours = compose_epsilon([SGMComponent(sigma, MNIST_Q, MNIST_STEPS)], 1e-5, "prv")
    assert ours == pytest.approx(pld_epsilon(sigma, MNIST_Q, MNIST_STEPS, 1e-5), rel=0.05)


def test_composition_of_two_components_is_between_one_and_the_sum():
    a, b = SGMComponent(1.0, 0.01, 2000), SGMComponent(2.0, 0.01, 2000)
    both = compose_epsilon([a, b], 1e-5)
    assert compose_epsilon([a], 1e-5) < both <= compose_epsilon([a], 1e-5) + compose_epsilon([b], 1e-5)


def test_zero_noise_means_no_finite_guarantee():
    assert math.isinf(compose_epsilon([SGMComponent(0.0, 0.1, 10)], 1e-5))


GRID = [(acc, target, q, epochs) for acc in ("rdp", "prv") for target in (1.0, 10.0)
        for q, epochs in ((64 / 3600, 4), (128 / 60000, 100), (0.05, 20))
        if not (acc == "prv" and epochs == 100)]  # PRV at 46,875 steps takes minutes: the golden tests cover it


@pytest.mark.parametrize("accountant, target, q, epochs", GRID)
def test_calibrated_sigma_never_overshoots(accountant, target, q, epochs):
    steps = steps_for_epochs(epochs, q)
    parts = {"student": (q, steps, 0.8), "discriminator": (q, steps, 0.2)}
    sigmas = calibrate_noise(target, 1e-5, parts, accountant)
    composed = compose_epsilon([SGMComponent(sigmas[n], q, steps) for n in parts], 1e-5, accountant)
    assert composed <= target
    assert composed >= 0.9 * target  # and the budget is used, not wasted


def test_calibration_with_a_fixed_upstream_component():
    teacher = SGMComponent(3.0, 0.02, 1000)
    sigmas = calibrate_noise(5.0, 1e-5, {"student": (0.02, 500, 1.0)}, "rdp", fixed=[teacher])
    assert compose_epsilon([teacher, SGMComponent(sigmas["student"], 0.02, 500)], 1e-5) <= 5.0
    with pytest.raises(PrivacyError, match="already spend"):
        calibrate_noise(0.01, 1e-5, {"student": (0.02, 500, 1.0)}, "rdp", fixed=[teacher])


def sgm(stage, sigma=1.0, q=0.02, steps=100, **kw):
    return make_entry(stage=stage, private=True, mechanism="sgm", sample_rate=q, noise_multiplier=sigma, steps=steps, clip_norm=1.0, **kw)


def test_verdict_true_for_public_teacher_and_dp_student():
    entries = [make_entry(stage="train_teacher", private=False, mechanism="none", steps=500), sgm("distill_student"), sgm("discriminator", 2.0)]
    result = verdict(entries, delta=1e-5, accountant="rdp", target_epsilon=100.0, num_private_records=3600)
    assert result["dp_guarantee"] is True and result["reasons"] == []
    assert result["epsilon"] == pytest.approx(compose_epsilon([SGMComponent(1.0, 0.02, 100), SGMComponent(2.0, 0.02, 100)], 1e-5))


def test_any_noise_free_private_stage_makes_the_verdict_false():
    entries = [make_entry(stage="train_teacher", private=True, mechanism="none", steps=500), sgm("distill_student")]
    result = verdict(entries, delta=1e-5, accountant="rdp", target_epsilon=100.0, num_private_records=3600)
    assert result["dp_guarantee"] is False and result["epsilon"] is None
    assert any("train_teacher: trained on private records without noise" in r for r in result["reasons"])


def test_unsound_entry_makes_the_verdict_false():
    entries = [sgm("distill_student", sigma=0.6 / 500, sound=False, notes="paper mode: effective noise multiplier 0.0012")]
    result = verdict(entries, delta=1e-5, accountant="rdp", target_epsilon=10.0, num_private_records=3600)
    assert result["dp_guarantee"] is False and "effective noise multiplier" in result["reasons"][0]


def test_delta_not_below_one_over_n_is_no_guarantee():
    result = verdict([sgm("distill_student")], delta=1e-3, accountant="rdp", target_epsilon=100.0, num_private_records=3600)
    assert result["dp_guarantee"] is False and "1/n" in result["reasons"][0]


def test_exceeding_the_target_fails_the_run():
    with pytest.raises(PrivacyError, match="exceeds the target"):
        verdict([sgm("distill_student", sigma=0.5, steps=5000)], delta=1e-5, accountant="rdp", target_epsilon=1.0, num_private_records=3600)


def test_epsilon_curve_increases_to_the_total():
    entries = [sgm("distill_student", steps=400)]
    curve = epsilon_curve(entries, delta=1e-5, accountant="rdp", points=5)
    values = [e for _, e in curve]
    assert values == sorted(values) and values[-1] == pytest.approx(compose_epsilon([SGMComponent(1.0, 0.02, 400)], 1e-5))
