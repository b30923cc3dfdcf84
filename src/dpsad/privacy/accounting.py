"""Privacy accounting for compositions of Poisson-subsampled Gaussian mechanisms.

Assumptions: each component is the sampled Gaussian mechanism of
:mod:`dpsad.privacy.mechanism.dpsgd` (Poisson rate q, noise multiplier sigma,
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
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

from .epsilon_cache import CACHE_ENV, CALIBRATION_CACHE_ENV, cache_named_by

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


# A one-step PLD holds about 1 MB of grid (0.2-1.3 MB at sigma 3 to 0.36): 64 of them bound the memory, and a
# process composes fewer distinct components than that (a dataset's budget: one to three a release).
@lru_cache(maxsize=64)
def _one_step_pld(noise_multiplier: float, sample_rate: float, interval: float):
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, value_discretization_interval=interval, sampling_prob=sample_rate,
        neighboring_relation=privacy_loss_distribution.NeighborRel.ADD_OR_REMOVE_ONE)


def _pld_epsilon(components: list[SGMComponent], delta: float, interval: float) -> float:
    """dp-accounting's PLDAccountant, step for step: ``identity.compose(one_step.self_compose(steps))`` in the
    components' order, with each distinct one-step PLD built once per process (about 0.3 s each).  The result is
    the accountant's bit for bit (tests/test_accounting.py compares them)."""
    from dp_accounting.pld import privacy_loss_distribution

    grid = pld_grid(components, interval)
    composed = privacy_loss_distribution.identity(value_discretization_interval=grid)
    for component in components:
        if component.sample_rate == 0:  # as the accountant: a step that samples nobody adds nothing
            continue
        step = _one_step_pld(float(component.noise_multiplier), float(component.sample_rate), grid)
        composed = composed.compose(step.self_compose(int(component.steps)))
    return float(composed.get_epsilon_for_delta(delta))


def _opacus_epsilon(components: list[SGMComponent], delta: float, kind: str) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    accountant.history = [(float(c.noise_multiplier), float(c.sample_rate), int(c.steps)) for c in components]
    return float(accountant.get_epsilon(delta=delta))


# A composition is a pure function of its arguments: a process composes each one once (the plan's noise search and
# the verdicts ask for the same ones again).  Failures raise, and are not kept.
@lru_cache(maxsize=4096)
def _composed(kind: str, pld_interval: float, active: tuple[SGMComponent, ...], delta: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns when the optimal RDP order is at the edge of its grid
        try:
            if kind == "pld":
                value = _pld_epsilon(list(active), delta, pld_interval)
            else:
                value = _opacus_epsilon(list(active), delta, kind)
        except (ValueError, RuntimeError, OverflowError, FloatingPointError, MemoryError) as err:
            raise AccountantError(f"the {kind} accountant failed on {list(active)}: {err}") from err
    if math.isnan(value):
        raise AccountantError(f"the {kind} accountant returned NaN on {list(active)}")
    return value


class EpsilonCache(Protocol):
    """Where an :class:`Accountant` keeps the compositions it made: ``key`` names one composition exactly."""

    def get(self, key: dict) -> float | None: ...

    def put(self, key: dict, value: float) -> None: ...


@dataclass(frozen=True)
class Accountant:
    """Composes sampled-Gaussian components into (epsilon at delta): the project's one way to compose.

    ``kind``: pld, prv or rdp.  ``pld_interval``: PLD's discretisation at sigma >= 1, widened below (see
    :func:`pld_grid`; pessimistic at any grid, coarser is looser and faster).  ``cache``: where finished
    compositions are kept (None: nowhere; the workflow's noise calibration has none, :func:`calibration_accountant`).
    """

    kind: str = DEFAULT_ACCOUNTANT
    pld_interval: float = PLD_DISCRETIZATION
    cache: EpsilonCache | None = None

    def __post_init__(self):
        if self.kind not in ACCOUNTANTS:
            raise ValueError(f"accountant '{self.kind}', expected one of {ACCOUNTANTS}")

    def key(self, components: list[SGMComponent], delta: float) -> dict:
        """The composition asked for, exactly (floats as repr: every bit of them counts)."""
        return {"accountant": self.kind, "delta": repr(float(delta)), "pld_interval": repr(float(self.pld_interval)),
                "components": [[repr(float(c.noise_multiplier)), repr(float(c.sample_rate)), int(c.steps)]
                               for c in components]}

    def epsilon(self, components: list[SGMComponent], delta: float) -> float:
        """(epsilon at ``delta``) of the adaptive composition of independently sampled ``components``.

        0 for nothing to compose; inf where a component with sigma = 0 takes a step.  Raises
        :class:`AccountantError` when the accountant fails (never falls back); failures are not cached.
        """
        active = [c for c in components if c.steps > 0]
        if not active:
            return 0.0
        if any(c.noise_multiplier <= 0 for c in active):
            return math.inf
        key = self.key(active, delta) if self.cache is not None else None
        if key is not None:
            known = self.cache.get(key)
            if known is not None:
                return known
        value = _composed(self.kind, float(self.pld_interval), tuple(active), float(delta))
        if key is not None and math.isfinite(value):
            self.cache.put(key, value)
        return value


def cached_accountant(kind: str, pld_interval: float = PLD_DISCRETIZATION) -> Accountant:
    """The verdict side's accountant of ``kind``: its compositions kept where ``DPSAD_EPSILON_CACHE`` names a
    folder (the workflow's jobs: ``.snakemake/dpsad-epsilons``), else nowhere."""
    return Accountant(kind, pld_interval, cache=cache_named_by(CACHE_ENV))


def calibration_accountant(kind: str) -> Accountant:
    """The noise calibration's accountant of ``kind`` (the plans' and the sizing rule's): no cache unless
    ``DPSAD_CALIBRATION_CACHE`` names a folder, which only the test suite does."""
    return Accountant(kind, PLD_DISCRETIZATION, cache=cache_named_by(CALIBRATION_CACHE_ENV))


def _as_accountant(accountant: str | Accountant) -> Accountant:
    return accountant if isinstance(accountant, Accountant) else Accountant(accountant)


def noise_for_target(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                     accountant: str | Accountant = DEFAULT_ACCOUNTANT, fixed: list[SGMComponent] | None = None,
                     rel_tol: float = 2e-3) -> float:
    """Smallest-found sigma with compose(fixed + SGM(sigma, q, steps)) <= target.

    ``accountant``: its kind, or an :class:`Accountant` whose kind and cache the search uses (its grids are the
    search's own).  The returned sigma always satisfies the target under ``accountant``; it
    is within ``rel_tol`` (relative) of the smallest such sigma.  A probe on
    which the accountant fails counts as not meeting the target.  The search keeps a bracket (low fails, high
    meets) and probes where the line through the last two probes in (log sigma, log epsilon) meets the target
    (secant; inside the bracket, else the line through its ends), nudged to the meeting side, then just below
    the new high: near the target that line is almost exact, so six to eight probes settle what bisection took
    twelve to nineteen for; a bracket that does not halve in two probes is bisected.
    PRV starts from RDP's sigma (RDP is looser, so that sigma meets the target too): PRV
    slows down sharply for small multipliers.  PLD needs no such start: its
    grid widens for small multipliers (:func:`pld_grid`), and the job need
    not load Opacus (~2 s).
    """
    from ..errors import PrivacyError

    if target_epsilon <= 0:
        raise ValueError(f"target_epsilon = {target_epsilon}, expected > 0")
    fixed = list(fixed or [])
    base = _as_accountant(accountant)

    def epsilon_at(sigma: float, interval: float = PLD_SEARCH_DISCRETIZATION) -> float:
        try:
            return replace(base, pld_interval=interval).epsilon(fixed + [SGMComponent(sigma, sample_rate, steps)],
                                                                delta)
        except AccountantError:
            return math.inf

    start = 1.0 if base.kind in ("rdp", "pld") else noise_for_target(
        target_epsilon, delta, sample_rate, steps, replace(base, kind="rdp"), fixed, rel_tol=0.05)
    low, low_eps, high, high_eps = _bracket(epsilon_at, target_epsilon, start)
    if high is None:
        raise PrivacyError(f"no noise multiplier up to 1e4 meets epsilon {target_epsilon:g} at delta {delta:g} "
                           f"(q = {sample_rate:.4g}, {steps} steps, upstream {fixed}); expected a larger target")
    if low is not None:
        step = math.log1p(rel_tol)
        probes = _logs_of_finite([(low, low_eps), (high, high_eps)])
        widths = [math.log(high / low)]
        while high / low > 1.0 + rel_tol:
            bottom, top = math.log(low), math.log(high)
            if len(widths) >= 3 and top - bottom > widths[-3] / 2:  # two probes that did not halve it: bisect
                guess = (bottom + top) / 2
            else:
                root = _line_root(probes[-2:], math.log(target_epsilon))
                if root is None or not bottom < root < top:  # the line through the bracket's ends, else its middle
                    root = _line_root(_logs_of_finite([(low, low_eps), (high, high_eps)]), math.log(target_epsilon))
                    root = (bottom + top) / 2 if root is None else root
                guess = root + step / 2  # to the meeting side, so that the next probe can close the bracket
                if guess > top - step:
                    guess = top - 0.999 * step  # close it from below: a miss there ends the search
            width = top - bottom
            sigma = math.exp(min(max(guess, bottom + width * 1e-3), top - width * 1e-3))
            value = epsilon_at(sigma)
            if value <= target_epsilon:
                high, high_eps = sigma, value
            else:
                low, low_eps = sigma, value
            probes += _logs_of_finite([(sigma, value)])
            widths.append(math.log(high / low))
    while base.kind == "pld" and (certified := epsilon_at(high, PLD_DISCRETIZATION)) > target_epsilon:
        if not math.isfinite(certified) or high > 1e4:  # PLD's certifying grid failed (out of memory), or found none
            raise PrivacyError(f"the {PLD_DISCRETIZATION:g} grid certifies no noise multiplier near {high:.4g} for "
                               f"epsilon {target_epsilon:g} (q = {sample_rate:.4g}, {steps} steps, epsilon there "
                               f"{certified:g}); expected a larger target or a step count the accountant can compose")
        high *= 1.0 + rel_tol
    return high


def _bracket(epsilon_at, target: float, start: float, lowest: float = 1e-4, highest: float = 1e4):
    """(low, epsilon(low), high, epsilon(high)): low misses the target (None if even ``lowest`` meets it), high
    meets it (None if ``highest`` misses it too).  Each next probe assumes epsilon ~ 1/sigma, which overshoots
    where the curve is steeper (small sigma), so one probe usually brackets; each step is at least 1.25x (0.8x),
    squared after every probe that did not bracket, so a flat curve (an upstream component near the target) or an
    infinite epsilon still reaches the ends in a few probes; the ends themselves are probed before giving up."""
    sigma, value = start, epsilon_at(start)
    if value <= target:
        high, high_eps, shrink = sigma, value, 0.8
        while high > lowest:
            sigma = max(high * min(shrink, value / target), lowest)
            value = epsilon_at(sigma)
            if value > target:
                return sigma, value, high, high_eps
            high, high_eps, shrink = sigma, value, shrink * shrink
        return None, None, high, high_eps
    low, low_eps, grow = sigma, value, 1.25
    while low < highest:
        sigma = min(low * (max(grow, value / target) if math.isfinite(value) else max(grow, 2.0)), highest)
        value = epsilon_at(sigma)
        if value <= target:
            return low, low_eps, sigma, value
        low, low_eps, grow = sigma, value, grow * grow
    return low, low_eps, None, None


def _logs_of_finite(probes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(log sigma, log epsilon) of the probes whose epsilon is finite and positive."""
    return [(math.log(sigma), math.log(value)) for sigma, value in probes if 0 < value < math.inf]


def _line_root(points: list[tuple[float, float]], log_target: float) -> float | None:
    """log sigma where the line through two points (log sigma, log epsilon) reaches log target; None without a
    line (fewer than two points, or a flat one)."""
    if len(points) < 2 or points[0][1] == points[1][1]:
        return None
    (x0, y0), (x1, y1) = points
    return x1 + (log_target - y1) * (x1 - x0) / (y1 - y0)


def calibrate_noise(target_epsilon: float, delta: float, *, sample_rate: float, steps: int, shares: dict[str, float],
                    accountant: str | Accountant = DEFAULT_ACCOUNTANT,
                    fixed: list[SGMComponent] | None = None) -> dict[str, float]:
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
        already = replace(_as_accountant(accountant), pld_interval=PLD_DISCRETIZATION).epsilon(fixed, delta)
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
