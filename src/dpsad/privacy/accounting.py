"""Privacy accounting for compositions of Poisson-subsampled Gaussian mechanisms.

Assumptions: each component is the sampled Gaussian mechanism of
:mod:`dpsad.privacy.mechanism` (Poisson rate q, noise multiplier sigma,
``steps`` releases), add/remove adjacency of one record, all components
reading the same private dataset.  Components with *independent* Poisson
batches compose adaptively (their privacy-loss distributions compose).
Noisy updates that read the *same* Poisson batch are one mechanism: a record
is in all of them or in none, so each step is one subsampled Gaussian with
effective multiplier sigma_eff = (sum_i sigma_i^-2)^-1/2 (the Gaussian
mechanisms on one batch compose exactly like one Gaussian of that multiplier,
adaptively too); see :func:`shared_batch_sigma`.

Accountants: ``pld`` (default; Google's dp-accounting privacy-loss
distributions, pessimistic discretisation, so an upper bound), ``prv``
(Opacus's PRV accountant, its upper estimate) and ``rdp`` (Opacus's RDP
accountant, looser by 10-20% in these regimes).  A failing accountant fails
the caller; nothing falls back to another accountant under the same label.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

ACCOUNTANTS = ("pld", "prv", "rdp")
DEFAULT_ACCOUNTANT = "pld"
# PLD grid: pessimistic rounding keeps the result an upper bound.  The rounding error grows with the number
# of steps: at MNIST paper scale (46,875 steps, sigma 1.9) a 1e-3 grid states 1.000 where 1e-4 states 0.977.
PLD_DISCRETIZATION = 1e-4
# The noise search probes PLD on a 10x coarser grid (10x faster, epsilon within ~1e-4 relative of the fine
# grid); the sigma it returns is then checked on the fine grid, which is what runs are certified with.
PLD_SEARCH_DISCRETIZATION = 1e-3
# One subsampled step's privacy loss spans [~0, 1/(2 sigma^2) + 8/sigma] (PLD's 1e-15 tail truncation keeps
# +-8 standard deviations of the Gaussian, 1/sigma loss units each), so below sigma 1 a fixed grid needs ever
# more points: at sigma 0.1 a 1e-4 grid took 15 s and 0.7 GB for 26 steps, and the noise search for epsilon
# 1e6 grew past 10 GB.  Below sigma 1 the grid widens with that span, which keeps the points (time, memory) at
# sigma 1's; the bound stays pessimistic, and the coarser rounding is negligible where it applies (epsilon
# 133.0605 on a 1e-4 grid, 133.0608 on 1e-2, at sigma 0.1).
PLD_GRID_SIGMA = 1.0


class AccountantError(RuntimeError):
    """An accountant could not evaluate a composition (no silent fallback: the caller must fail)."""


@dataclass(frozen=True)
class SGMComponent:
    """One sampled-Gaussian component: ``steps`` releases at rate q with noise multiplier sigma."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def pld_grid(components: list[SGMComponent], interval: float) -> float:
    """The discretisation used for ``components``: ``interval``, widened below sigma 1 with one step's loss span."""

    def span(sigma: float) -> float:
        return 0.5 / sigma ** 2 + 8.0 / sigma

    smallest = min(c.noise_multiplier for c in components)
    return interval * max(1.0, span(smallest) / span(PLD_GRID_SIGMA))


def shared_batch_sigma(noise_multipliers) -> float:
    """Effective multiplier of Gaussian updates that all read the same batch: (sum sigma_i^-2)^-1/2.

    Each update i adds N(0, sigma_i^2 C_i^2) to a sum of sensitivity C_i; in
    units of its own sensitivity it is a Gaussian mechanism with mu_i = 1/sigma_i,
    and Gaussian mechanisms compose (adaptively) to mu = sqrt(sum mu_i^2).
    A zero multiplier gives zero (no guarantee).
    """
    sigmas = [float(s) for s in noise_multipliers]
    if not sigmas:
        raise ValueError("shared_batch_sigma of no multipliers, expected at least one")
    if any(s <= 0 for s in sigmas):
        return 0.0
    return sum(s ** -2 for s in sigmas) ** -0.5


def split_shared_batch_sigma(sigma_eff: float, shares: dict[str, float]) -> dict[str, float]:
    """sigma_i = sigma_eff / sqrt(w_i) with w_i = share_i / sum(shares), so that sum sigma_i^-2 = sigma_eff^-2."""
    total = float(sum(shares.values()))
    if total <= 0 or any(w <= 0 for w in shares.values()):
        raise ValueError(f"budget shares {shares}, expected positive numbers")
    return {name: sigma_eff / math.sqrt(w / total) for name, w in shares.items()}


def _pld_epsilon(components: list[SGMComponent], delta: float, interval: float = PLD_DISCRETIZATION) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=pld_grid(components, interval))
    events = [dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(c.sample_rate, dp_event.GaussianDpEvent(c.noise_multiplier)), c.steps)
        for c in components]
    accountant.compose(dp_event.ComposedDpEvent(events))
    return float(accountant.get_epsilon(delta))


def _opacus_epsilon(components: list[SGMComponent], delta: float, kind: str) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    accountant.history = [(float(c.noise_multiplier), float(c.sample_rate), int(c.steps)) for c in components]
    return float(accountant.get_epsilon(delta=delta))


def compose_epsilon(components: list[SGMComponent], delta: float, accountant: str = DEFAULT_ACCOUNTANT,
                    pld_interval: float = PLD_DISCRETIZATION) -> float:
    """(epsilon at ``delta``) of the adaptive composition of independently sampled ``components``.

    A component with sigma = 0 and at least one step has no finite guarantee: inf.
    Raises :class:`AccountantError` when the accountant fails (never falls back).
    ``pld_interval`` is PLD's discretisation at sigma >= 1, widened as 1/sigma below (see :func:`pld_grid`;
    pessimistic at any grid, coarser is looser and faster).
    """
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant '{accountant}', expected one of {ACCOUNTANTS}")
    active = [c for c in components if c.steps > 0]
    if not active:
        return 0.0
    if any(c.noise_multiplier <= 0 for c in active):
        return math.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns when the optimal RDP order is at the edge of its grid
        try:
            if accountant == "pld":
                value = _pld_epsilon(active, delta, pld_interval)
            else:
                value = _opacus_epsilon(active, delta, accountant)
        except (ValueError, RuntimeError, OverflowError, FloatingPointError, MemoryError) as err:
            raise AccountantError(f"the {accountant} accountant failed on {active}: {err}") from err
    if math.isnan(value):
        raise AccountantError(f"the {accountant} accountant returned NaN on {active}")
    return value


def noise_for_target(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                     accountant: str = DEFAULT_ACCOUNTANT, fixed: list[SGMComponent] | None = None,
                     rel_tol: float = 2e-3) -> float:
    """Smallest-found sigma with compose(fixed + SGM(sigma, q, steps)) <= target (bisection in log sigma).

    The returned sigma always satisfies the target under ``accountant``; it
    is within ``rel_tol`` (relative) of the smallest such sigma.  A probe on
    which the accountant fails counts as not meeting the target.  PRV starts
    from RDP's sigma (RDP is looser, so that sigma meets the target too): PRV
    slows down sharply for small multipliers.  PLD needs no such start: its
    grid widens for small multipliers (:func:`pld_grid`), and the job need
    not load Opacus (~2 s).
    """
    from ..errors import PrivacyError

    if target_epsilon <= 0:
        raise ValueError(f"target_epsilon = {target_epsilon}, expected > 0")
    fixed = list(fixed or [])

    def meets(sigma: float, interval: float = PLD_SEARCH_DISCRETIZATION) -> bool:
        try:
            return compose_epsilon(fixed + [SGMComponent(sigma, sample_rate, steps)], delta, accountant,
                                   pld_interval=interval) <= target_epsilon
        except AccountantError:
            return False

    if accountant in ("rdp", "pld"):
        high, factor = 1.0, 2.0
    else:
        high, factor = noise_for_target(target_epsilon, delta, sample_rate, steps, "rdp", fixed, rel_tol=0.05), 1.1
    while not meets(high):
        high *= factor
        if high > 1e4:
            raise PrivacyError(f"no noise multiplier up to 1e4 meets epsilon {target_epsilon:g} at delta {delta:g} "
                               f"(q = {sample_rate:.4g}, {steps} steps, upstream {fixed}); expected a larger target")
    low = high / factor
    while meets(low):
        high, low = low, low / factor
        if low < 1e-4:
            return high
    while high / low > 1.0 + rel_tol:
        mid = math.sqrt(low * high)
        if meets(mid):
            high = mid
        else:
            low = mid
    while not meets(high, PLD_DISCRETIZATION):  # the certifying grid has the last word (PLD only differs here)
        high *= 1.0 + rel_tol
    return high


def calibrate_noise(target_epsilon: float, delta: float, *, sample_rate: float, steps: int, shares: dict[str, float],
                    accountant: str = DEFAULT_ACCOUNTANT, fixed: list[SGMComponent] | None = None) -> dict[str, float]:
    """Noise multipliers of the noisy updates that share one Poisson batch, meeting ``target_epsilon``.

    ``shares`` maps each update (e.g. student, discriminator) to its budget
    share w_i.  The joint mechanism SGM(sigma_eff, q, steps) is calibrated so
    that its composition with the ``fixed`` upstream components (e.g. a DP
    teacher already trained on independent batches) meets the target; then
    sigma_i = sigma_eff / sqrt(w_i / sum w).  One update: shares {name: 1}.
    The result always satisfies compose(fixed + SGM(shared_batch_sigma(sigmas))) <= target.
    """
    from ..errors import PrivacyError

    if target_epsilon <= 0:
        raise ValueError(f"target_epsilon = {target_epsilon}, expected > 0")
    fixed = list(fixed or [])
    if fixed:
        already = compose_epsilon(fixed, delta, accountant)
        if already >= target_epsilon:
            raise PrivacyError(f"upstream components already spend epsilon {already:.4f} >= the target {target_epsilon:g}")
    # The tiny margin keeps rounding in the split from moving the recombined sigma below the calibrated one.
    sigma_eff = noise_for_target(target_epsilon, delta, sample_rate, steps, accountant, fixed=fixed) * (1 + 1e-9)
    return split_shared_batch_sigma(sigma_eff, shares)


def delta_problem(delta: float, n: int) -> str | None:
    """Why ``delta`` gives no guarantee for ``n`` private records, or None.

    delta must stay below 1/n: a mechanism that publishes one random record whole is (0, 1/n)-DP.  n = 0 (no
    private record) has nothing to protect.  The one place this check is made."""
    if n > 0 and delta >= 1.0 / n:
        return f"delta = {delta:g} is not below 1/n = {1.0 / n:.3g} for n = {n} private records"
    return None


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
    """Number of Poisson steps for ``epochs`` passes in expectation: ceil(epochs / q)."""
    return int(math.ceil(epochs / sample_rate))
