"""Accounting: golden values, independent accountants, shared-batch composition, calibration, the verdict."""

from __future__ import annotations

import contextlib
import math
import resource
from pathlib import Path

import pytest

from dpsad.errors import PrivacyError
from dpsad.privacy.accounting import (
    SGMComponent,
    calibrate_noise,
    PLD_SEARCH_DISCRETIZATION,
    Accountant,
    noise_for_target,
    shared_batch_sigma,
    split_shared_batch_sigma,
    steps_for_epochs,
)
from dpsad.privacy.books.ledger import components_of, epsilon_curve, label_set_reasons, make_entry, verdict

SRC = Path(__file__).resolve().parents[1] / "src" / "dpsad"
MNIST_Q = 128 / 60000
MNIST_STEPS = 46875
DEMO_Q, DEMO_STEPS = 64 / 3600, 113


def independent_pld(sigma, q, steps, delta, interval=1e-4):
    """Google's dp-accounting PLD, called here directly (not through dpsad's accounting code)."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=interval).compose(event).get_epsilon(delta)


@pytest.mark.e2e  # the published figures at their sizes: seconds of composition each
@pytest.mark.parametrize("sigma, rdp, prv, pld", [(1.9, 1.067, 0.986, 0.977), (0.6, 10.51, 9.491, 9.480)])
def test_golden_epsilons(sigma, rdp, prv, pld):
    comp = [SGMComponent(sigma, MNIST_Q, MNIST_STEPS)]
    assert Accountant("rdp").epsilon(comp, 1e-5) == pytest.approx(rdp, rel=0.01)
    assert Accountant("prv").epsilon(comp, 1e-5) == pytest.approx(prv, rel=0.01)
    assert Accountant("pld").epsilon(comp, 1e-5) == pytest.approx(pld, rel=0.005)


def test_default_accountant_is_the_tight_pld():
    comp = [SGMComponent(0.6, MNIST_Q, MNIST_STEPS)]
    assert Accountant().epsilon(comp, 1e-5) == Accountant("pld").epsilon(comp, 1e-5)
    assert Accountant().epsilon(comp, 1e-5) < 0.92 * Accountant("rdp").epsilon(comp, 1e-5)


@pytest.mark.parametrize("sigma", [1.9, pytest.param(0.6, marks=pytest.mark.e2e)])
def test_pld_agrees_with_opacus_prv_an_independent_implementation(sigma):
    ours = Accountant("pld").epsilon([SGMComponent(sigma, MNIST_Q, MNIST_STEPS)], 1e-5)
    assert ours == pytest.approx(Accountant("prv").epsilon([SGMComponent(sigma, MNIST_Q, MNIST_STEPS)], 1e-5), rel=0.02)


def test_composition_of_two_independent_components_is_between_one_and_the_sum():
    a, b = SGMComponent(1.0, 0.01, 2000), SGMComponent(2.0, 0.01, 2000)
    both = Accountant().epsilon([a, b], 1e-5)
    assert Accountant().epsilon([a], 1e-5) < both <= Accountant().epsilon([a], 1e-5) + Accountant().epsilon([b], 1e-5)


def test_zero_noise_means_no_finite_guarantee():
    assert math.isinf(Accountant().epsilon([SGMComponent(0.0, 0.1, 10)], 1e-5))


def _accountants_own_pld(components, delta, interval):
    """dp-accounting's PLDAccountant on the events the ledger's components stand for."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from dpsad.privacy.accounting import pld_grid

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=pld_grid(components, interval))
    accountant.compose(dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(c.sample_rate, dp_event.GaussianDpEvent(c.noise_multiplier)), c.steps)
        for c in components if c.steps > 0]))
    return float(accountant.get_epsilon(delta))


def test_reused_one_step_plds_give_the_accountants_epsilon_bit_for_bit():
    """The accountant's PLD compositions, each one-step PLD built once a process, against dp-accounting's own
    PLDAccountant: equal as floats, for repeated components, a prefix grown one release at a time, sigma below 1
    (a widened grid), q = 1, a component without steps, and again after every one-step PLD has been reused
    (composing changes none).  On the 1e-3 grid, where the code is the same and the test takes seconds."""
    from dpsad.privacy.accounting import _one_step_pld

    _one_step_pld.cache_clear()
    released = [SGMComponent(0.7, 0.004, 13), SGMComponent(1.1, DEMO_Q, 30), SGMComponent(0.7, 0.004, 13),
                SGMComponent(2.0, 1.0, 3), SGMComponent(5.0, 0.01, 0), SGMComponent(1.1, DEMO_Q, 60)]
    pld = Accountant("pld", 1e-3)
    for prefix in (2, 4, len(released)):
        assert pld.epsilon(released[:prefix], 1e-5) == _accountants_own_pld(released[:prefix], 1e-5, 1e-3)
    assert pld.epsilon(released[::-1], 1e-6) == _accountants_own_pld(released[::-1], 1e-6, 1e-3)
    assert _one_step_pld.cache_info().hits >= 6 and _one_step_pld.cache_info().currsize == 3  # built once, reused
    assert pld.epsilon([], 1e-5) == 0.0 and math.isinf(pld.epsilon([SGMComponent(0.0, 0.1, 10)], 1e-5))


@contextlib.contextmanager
def memory_that_cannot_hold_the_grid(headroom: int = 1 << 30):
    """This process's address space limited to what it maps now plus ``headroom`` bytes, so that PRV's grid for
    sigma 0.0038 (a 5.66 TiB array) is refused on any host.  Failure prevented: where the kernel grants any
    allocation (``vm.overcommit_memory = 1``) the array is granted, and the worker is killed as it fills it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = mapped + headroom if hard == resource.RLIM_INFINITY else min(hard, mapped + headroom)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_the_grids_memory_limit_refuses_what_the_host_grants_and_is_lifted_after():
    import numpy as np

    beyond_the_headroom = 2 << 30  # bytes, never touched: only the address space is asked for
    np.empty(beyond_the_headroom, dtype=np.uint8)
    with memory_that_cannot_hold_the_grid(), pytest.raises(MemoryError):
        np.empty(beyond_the_headroom, dtype=np.uint8)
    np.empty(beyond_the_headroom, dtype=np.uint8)


def test_an_accountant_failure_fails_instead_of_falling_back():
    from dpsad.privacy.accounting import AccountantError

    with pytest.raises(AccountantError, match="prv"), memory_that_cannot_hold_the_grid():
        Accountant("prv").epsilon([SGMComponent(0.0038, MNIST_Q, 1000)], 1e-5)  # sigma/T = 0.0038: the paper mode's


# Shared batches ---------------------------------------------------------------------------------------------

def test_shared_batch_sigma_and_its_split():
    assert shared_batch_sigma([0.524, 0.877]) == pytest.approx((0.524 ** -2 + 0.877 ** -2) ** -0.5)
    sigmas = split_shared_batch_sigma(0.5, {"student": 0.8, "discriminator": 0.2})
    assert sigmas["student"] == pytest.approx(0.5 / math.sqrt(0.8)) and sigmas["discriminator"] == pytest.approx(0.5 / math.sqrt(0.2))
    assert shared_batch_sigma(sigmas.values()) == pytest.approx(0.5)
    assert shared_batch_sigma([1.0, 0.0]) == 0.0


def sgm(stage, sigma=1.0, q=0.02, steps=100, **kw):
    kw.setdefault("noise_seed", "secret")
    return make_entry(stage=stage, private=True, mechanism="sgm", sample_rate=q, noise_multiplier=sigma, steps=steps,
                      clip_norm=1.0, **kw)


def test_entries_sharing_a_batch_are_one_mechanism_at_sigma_eff():
    """The demo's eps-10 sigmas of the old calibration: stated 9.995 as two components, really about 12.57."""
    old = [sgm("distill_student", 0.524, DEMO_Q, DEMO_STEPS), sgm("discriminator", 0.877, DEMO_Q, DEMO_STEPS)]
    as_independent = Accountant().epsilon(components_of(old), 1e-5)
    joint = [dict(e, batch="distill_student") for e in old]
    (component,) = components_of(joint)
    assert component.noise_multiplier == pytest.approx(shared_batch_sigma([0.524, 0.877]))
    stated = verdict(joint, delta=1e-5, accountant="pld", target_epsilon=None, num_private_records=3600)["epsilon"]
    truth = independent_pld(shared_batch_sigma([0.524, 0.877]), DEMO_Q, DEMO_STEPS, 1e-5)
    assert stated == pytest.approx(truth, rel=0.02)
    assert truth == pytest.approx(12.57, abs=0.05)
    assert as_independent < 10.0 < truth  # composing them independently under-reports


def test_a_shared_batch_with_different_rates_is_refused():
    with pytest.raises(PrivacyError, match="disagree"):
        components_of([sgm("a", batch="b"), sgm("b", q=0.03, batch="b")])


# Calibration -------------------------------------------------------------------------------------------------

# The split does not change sigma_eff (test_shared_batch_sigma_and_its_split), so two splits suffice.  The unit
# tests keep the demo's case under the default accountant; the rest of the grid runs with `make test` (e2e).
GRID = [pytest.param(acc, target, q, epochs, shares,
                     marks=() if (acc, q) == ("pld", DEMO_Q) else pytest.mark.e2e)
        for acc in ("pld", "rdp") for target in (1.0, 10.0)
        for (q, epochs), shares in (((DEMO_Q, 2), {"student": 0.8, "discriminator": 0.2}),
                                    ((512 / 3600, 20), {"student": 0.5, "discriminator": 0.5}),
                                    ((0.05, 20), {"student": 1.0}))]


@pytest.mark.parametrize("accountant, target, q, epochs, shares", GRID)
def test_calibrated_joint_mechanism_never_overshoots(accountant, target, q, epochs, shares):
    steps = steps_for_epochs(epochs, q)
    sigmas = calibrate_noise(target, 1e-5, sample_rate=q, steps=steps, shares=shares, accountant=accountant)
    assert set(sigmas) == set(shares)
    composed = Accountant(accountant).epsilon([SGMComponent(shared_batch_sigma(sigmas.values()), q, steps)], 1e-5)
    assert composed <= target
    assert composed >= 0.97 * target  # and the budget is used, not wasted


@pytest.mark.parametrize("target", [1.0, 10.0])
def test_pld_calibration_holds_under_an_independent_recomputation(target):
    sigmas = calibrate_noise(target, 1e-5, sample_rate=DEMO_Q, steps=DEMO_STEPS,
                             shares={"student": 0.8, "discriminator": 0.2})
    assert independent_pld(shared_batch_sigma(sigmas.values()), DEMO_Q, DEMO_STEPS, 1e-5) <= target


def test_calibration_with_a_fixed_upstream_component():
    teacher = SGMComponent(3.0, 0.02, 1000)
    sigmas = calibrate_noise(5.0, 1e-5, sample_rate=0.02, steps=500, shares={"student": 1.0}, fixed=[teacher])
    assert Accountant().epsilon([teacher, SGMComponent(sigmas["student"], 0.02, 500)], 1e-5) <= 5.0
    with pytest.raises(PrivacyError, match="already spend"):
        calibrate_noise(0.01, 1e-5, sample_rate=0.02, steps=500, shares={"student": 1.0}, fixed=[teacher])



class _CountingCache:
    """An epsilon cache that keeps nothing and counts the compositions the search asks for."""

    def __init__(self):
        self.asked = 0

    def get(self, key):
        self.asked += 1

    def put(self, key, value):
        pass


@pytest.mark.parametrize("epsilon, q, steps, kind, fixed", [
    (10.0, 0.064, 1500, "pld", None), (0.5, 0.0625, 64, "pld", None),
    (10.0, 0.25, 64, "pld", [SGMComponent(3.0, 0.1, 200)]), (10.0, 0.032, 125, "rdp", None)])
def test_the_noise_search_ends_within_its_tolerance_of_the_smallest_sigma_in_at_most_nine_probes(
        epsilon, q, steps, kind, fixed):
    """Bisection from sigma 1 took 12 to 19 compositions on these; the secant search takes at most 9, and its sigma
    still meets the target on the certifying grid while one two tolerances smaller misses it."""
    counting, rel_tol = _CountingCache(), 2e-3
    sigma = noise_for_target(epsilon, 1e-5, q, steps, Accountant(kind, cache=counting), fixed, rel_tol=rel_tol)
    assert counting.asked <= 9
    upstream = list(fixed or [])
    assert Accountant(kind).epsilon(upstream + [SGMComponent(sigma, q, steps)], 1e-5) <= epsilon
    smaller = SGMComponent(sigma / (1 + rel_tol) ** 2, q, steps)
    assert Accountant(kind, pld_interval=PLD_SEARCH_DISCRETIZATION).epsilon(upstream + [smaller], 1e-5) > epsilon



@pytest.mark.parametrize("epsilon, steps, kind", [(0.06, 1000, "pld"), (0.5, 10000, "rdp")])
def test_a_sigma_far_above_the_searchs_start_is_found_and_none_past_1e4_is_claimed(epsilon, steps, kind):
    """Every record in every step (q = 1) at a small target: epsilon at sigma 1 is over 1e4 times the target, so
    a step sized by epsilon ~ 1/sigma jumps past 1e4; the search probes 1e4 itself before it gives up."""
    sigma = noise_for_target(epsilon, 1e-5, 1.0, steps, kind)
    assert 700 < sigma < 1e4 and Accountant(kind).epsilon([SGMComponent(sigma, 1.0, steps)], 1e-5) <= epsilon
    smaller = SGMComponent(sigma / (1 + 2e-3) ** 2, 1.0, steps)
    assert Accountant(kind, pld_interval=PLD_SEARCH_DISCRETIZATION).epsilon([smaller], 1e-5) > epsilon
    with pytest.raises(PrivacyError, match="no noise multiplier up to 1e4 meets epsilon 0.0001"):
        noise_for_target(1e-4, 1e-5, 1.0, steps, kind)



class _FailingFineGrid(_CountingCache):
    """Answers every composition on PLD's certifying grid as failed (infinite), as an out-of-memory grid would."""

    def get(self, key):
        return math.inf if key["pld_interval"] == repr(1e-4) else None


def test_a_certifying_grid_that_fails_stops_the_search_at_once():
    with pytest.raises(PrivacyError, match="certifies no noise multiplier near"):
        noise_for_target(10.0, 1e-5, 0.064, 1500, Accountant("pld", cache=_FailingFineGrid()))


# The verdict -------------------------------------------------------------------------------------------------

def test_verdict_true_for_public_teacher_and_dp_student_with_dp_discriminator():
    entries = [make_entry(stage="train_teacher", private=False, mechanism="none", steps=500),
               sgm("distill_student", batch="distill_student"), sgm("discriminator", 2.0, batch="distill_student")]
    result = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=100.0, num_private_records=3600)
    assert result["dp_guarantee"] is True and result["reasons"] == []
    assert result["epsilon"] == pytest.approx(Accountant().epsilon([SGMComponent(shared_batch_sigma([1.0, 2.0]), 0.02, 100)], 1e-5))


def test_a_fixed_noise_seed_makes_the_verdict_false():
    result = verdict([sgm("distill_student", noise_seed="fixed")], delta=1e-5, accountant="pld", target_epsilon=100.0,
                     num_private_records=3600)
    assert result["dp_guarantee"] is False and result["epsilon"] is None
    assert "noise seed fixed in the configuration" in result["reasons"][0]


def test_any_noise_free_private_stage_makes_the_verdict_false():
    entries = [make_entry(stage="train_teacher", private=True, mechanism="none", steps=500), sgm("distill_student")]
    result = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=100.0, num_private_records=3600)
    assert result["dp_guarantee"] is False and result["epsilon"] is None
    assert any("train_teacher: trained on private records without noise" in r for r in result["reasons"])


def test_unsound_entry_makes_the_verdict_false():
    entries = [sgm("distill_student", sigma=0.6 / 500, sound=False, notes="paper mode: effective noise multiplier 0.0012")]
    result = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=10.0, num_private_records=3600)
    assert result["dp_guarantee"] is False and "effective noise multiplier" in result["reasons"][0]
    assert result["epsilon_noisy_components_only"] > 1000  # stated for information, never as a guarantee


def test_delta_not_below_one_over_n_is_no_guarantee():
    result = verdict([sgm("distill_student")], delta=1e-3, accountant="pld", target_epsilon=100.0, num_private_records=3600)
    assert result["dp_guarantee"] is False and "1/n" in result["reasons"][0]


def test_delta_problem_is_the_one_check_of_delta_below_one_over_n_and_every_stage_uses_it():
    from dpsad.privacy.accounting import delta_problem

    assert delta_problem(1e-5, 4000) is None and delta_problem(0.5, 0) is None  # n = 0: nothing private
    assert delta_problem(1 / 4000, 4000) == "delta = 0.00025 is not below 1/n = 0.00025 for n = 4000 private records"
    checks = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if "1.0 / n" in path.read_text()}
    assert checks == {"privacy/accounting.py"}
    callers = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if "delta_problem(" in path.read_text()}
    assert callers >= {"privacy/mechanism/plan.py", "data/datafile.py", "privacy/books/ledger.py", "privacy/books/release_budget.py"}


def test_a_label_set_derived_from_private_labels_is_no_guarantee():
    reasons = label_set_reasons({"label_set_from_data": True, "labelled": True}, "mine")
    assert reasons and "data.mine.class_names" in reasons[0]
    assert label_set_reasons({"label_set_from_data": False, "labelled": True}, "mine") == []
    assert label_set_reasons({"label_set_from_data": True, "labelled": False}, "mine") == []
    result = verdict([sgm("distill_student")], delta=1e-5, accountant="pld", target_epsilon=100.0,
                     num_private_records=3600, extra_reasons=reasons)
    assert result["dp_guarantee"] is False


def test_exceeding_the_target_fails_the_run():
    with pytest.raises(PrivacyError, match="exceeds the target"):
        verdict([sgm("distill_student", sigma=0.5, steps=5000)], delta=1e-5, accountant="pld", target_epsilon=1.0,
                num_private_records=3600)


def test_epsilon_curve_increases_to_the_total():
    entries = [sgm("distill_student", steps=400)]
    curve = epsilon_curve(entries, delta=1e-5, accountant="pld", points=5)
    values = [e for _, e in curve]
    total = Accountant().epsilon([SGMComponent(1.0, 0.02, 400)], 1e-5)
    # the curve uses the coarser (still pessimistic) search grid: never below the stated total, and close to it
    assert values == sorted(values) and values[-1] >= total and values[-1] == pytest.approx(total, rel=1e-3)


# The accountant's cache -------------------------------------------------------------------------------------

class CountingCache(dict):
    """An in-memory EpsilonCache that counts what it was asked and given."""

    def __init__(self):
        super().__init__()
        self.gets, self.puts = 0, 0

    def get(self, key):
        self.gets += 1
        return super().get(repr(key))

    def put(self, key, value):
        self.puts += 1
        self[repr(key)] = value


def test_an_injected_cache_answers_the_same_composition_and_only_that_one():
    components = [SGMComponent(1.1, DEMO_Q, DEMO_STEPS), SGMComponent(2.0, 0.01, 40)]
    cache = CountingCache()
    cached = Accountant("pld", cache=cache)
    truth = Accountant("pld").epsilon(components, 1e-5)
    assert cached.epsilon(components, 1e-5) == truth and cache.puts == 1
    (key,) = cache
    cache[key] = 0.5  # a cache answers without composing: what it holds is what the accountant returns
    assert cached.epsilon(components, 1e-5) == 0.5 and cache.puts == 1
    # every argument is in the key: another delta, step count, grid or accountant is composed anew
    assert cached.epsilon(components, 1e-6) > truth
    assert cached.epsilon(components[:1] + [SGMComponent(2.0, 0.01, 41)], 1e-5) > truth
    assert Accountant("pld", 1e-3, cache=cache).epsilon(components, 1e-5) >= truth
    assert Accountant("rdp", cache=cache).epsilon(components, 1e-5) > truth
    assert cache.puts == 5 and len(cache) == 5


def test_a_failing_or_unbounded_composition_is_never_cached():
    from dpsad.privacy.accounting import AccountantError

    cache = CountingCache()
    for _ in range(2):
        with pytest.raises(AccountantError, match="prv"), memory_that_cannot_hold_the_grid():
            Accountant("prv", cache=cache).epsilon([SGMComponent(0.0038, MNIST_Q, 1000)], 1e-5)
    assert math.isinf(Accountant("pld", cache=cache).epsilon([SGMComponent(0.0, 0.1, 10)], 1e-5))
    assert cache.puts == 0


def test_the_workspace_cache_keeps_a_composition_on_disk_and_never_believes_a_file_of_another(tmp_path, monkeypatch):
    from dpsad.privacy.accounting import cached_accountant
    from dpsad.privacy.epsilon_cache import CACHE_ENV, FileEpsilonCache

    components = [SGMComponent(1.1, DEMO_Q, DEMO_STEPS), SGMComponent(2.0, 0.01, 40)]
    truth = Accountant("pld").epsilon(components, 1e-5)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert cached_accountant("pld").cache is None
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cached_accountant("pld").epsilon(components, 1e-5) == truth
    (kept,) = tmp_path.rglob("*.json")
    files = FileEpsilonCache(tmp_path)
    key = Accountant("pld").key(components, 1e-5)
    assert files.get(key) == truth
    # a file that does not hold this composition (a value edited without its checksum, another key under this
    # name, a truncated file) is never believed
    stored = kept.read_text()
    kept.write_text(stored.replace(repr(truth), "0.001"))
    assert files.get(key) is None and cached_accountant("pld").epsilon(components, 1e-5) == truth
    assert kept.read_text() == stored  # composed again and rewritten
    kept.write_text(stored.replace('"1e-05"', '"1e-06"'))
    assert files.get(key) is None
    kept.write_text(stored[:40])
    assert files.get(key) is None
    kept.write_text(stored)
    # a change of the accounting code is another key
    assert FileEpsilonCache(tmp_path, code="other code").get(key) is None and files.get(key) == truth


def test_one_use_inherited_twice_counts_once_and_two_different_uses_under_one_uid_are_refused(tmp_path):
    from dpsad.errors import DpsadError
    from dpsad.privacy.books.ledger import read_ledgers, unique_entries, write_ledger

    teacher = sgm("train_teacher", 2.0)
    again = {**teacher, "notes": "read through a second input"}
    assert unique_entries([teacher, again]) == [teacher]
    cheaper = {**teacher, "noise_multiplier": 20.0}
    with pytest.raises(DpsadError, match=rf"use {teacher['uid']} .* differ in \['noise_multiplier'\]"):
        unique_entries([cheaper, teacher])
    write_ledger(tmp_path / "teacher.ledger.json", [teacher])
    write_ledger(tmp_path / "other.ledger.json", [{**teacher, "records": "another preparation"}])
    with pytest.raises(DpsadError, match=r"differ in \['records'\]"):
        read_ledgers([tmp_path / "teacher.ledger.json", tmp_path / "other.ledger.json"])
    with pytest.raises(DpsadError, match=r"differ in \['public_records'\]"):  # beside another public split
        unique_entries([{**teacher, "public_records": "one public split"}, {**teacher, "public_records": "another"}])
