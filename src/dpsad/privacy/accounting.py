"""Privacy accounting for compositions of Poisson-subsampled Gaussian mechanisms.

Assumptions: each component is the sampled Gaussian mechanism of
:mod:`dpsad.privacy.mechanism` (Poisson rate q, noise multiplier sigma,
``steps`` releases), add/remove adjacency of one record, all components
reading the same private dataset.  Components compose adaptively, so their
RDP curves (or privacy-loss distributions) add.  Opacus does the analysis:
RDP by default, PRV on request.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

ACCOUNTANTS = ("rdp", "prv")


@dataclass(frozen=True)
class SGMComponent:
    """One sampled-Gaussian component: ``steps`` releases at rate q with noise multiplier sigma."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def _accountant(kind: str):
    if kind == "rdp":
        return RDPAccountant()
    if kind == "prv":
        return PRVAccountant()
    raise ValueError(f"accountant '{kind}', expected one of {ACCOUNTANTS}")


def compose_epsilon(components: list[SGMComponent], delta: float, accountant: str = "rdp") -> float:
    """(epsilon at ``delta``) of the adaptive composition of ``components``.

    A component with sigma = 0 and at least one step has no finite guarantee: inf.
    """
    active = [c for c in components if c.steps > 0]
    if not active:
        return 0.0
    if any(c.noise_multiplier <= 0 for c in active):
        return math.inf
    acc = _accountant(accountant)
    acc.history = [(float(c.noise_multiplier), float(c.sample_rate), int(c.steps)) for c in active]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns when the optimal RDP order is at the edge of its grid
        try:
            return float(acc.get_epsilon(delta=delta))
        except (ValueError, RuntimeError, OverflowError):
            if accountant == "prv":  # PRV's domain can overflow for tiny noise; RDP still bounds it
                return compose_epsilon(components, delta, "rdp")
            raise


def noise_for_target(target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp") -> float:
    """Smallest-found sigma (Opacus bisection) with epsilon(sigma) <= target for one component."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(get_noise_multiplier(
            target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
            steps=steps, accountant=accountant, epsilon_tolerance=0.005,
        ))


def calibrate_noise(target_epsilon: float, delta: float, parts: dict[str, tuple[float, int, float]],
                    accountant: str = "rdp", fixed: list[SGMComponent] | None = None) -> dict[str, float]:
    """Noise multipliers for several components so that their composition meets ``target_epsilon``.

    ``parts`` maps a component name to (sample_rate, steps, budget_share).
    Each component first gets Opacus's sigma for epsilon = target * share /
    sum(shares) alone; that composition is below the target (composition in
    RDP is never worse than adding epsilons).  All sigmas are then scaled by
    one common factor, found by bisection, so the composition uses the budget
    without exceeding it.  ``fixed`` components (e.g. a DP teacher already
    trained) are part of the composition but not scaled.  The returned sigmas
    always satisfy compose_epsilon(fixed + parts) <= target_epsilon.
    """
    from ..errors import PrivacyError

    if target_epsilon <= 0:
        raise ValueError(f"target_epsilon = {target_epsilon}, expected > 0")
    fixed = list(fixed or [])
    already = compose_epsilon(fixed, delta, accountant) if fixed else 0.0
    if already >= target_epsilon:
        raise PrivacyError(f"upstream components already spend epsilon {already:.4f} >= the target {target_epsilon:g}")
    total_share = sum(share for _, _, share in parts.values())
    base = {
        name: noise_for_target(target_epsilon * share / total_share, delta, q, steps, accountant)
        for name, (q, steps, share) in parts.items()
    }

    if len(parts) == 1 and not fixed:  # Opacus's bisection already gives the tight sigma for a single component
        return base

    def composed(scale: float) -> float:
        comps = [SGMComponent(base[n] * scale, q, steps) for n, (q, steps, _) in parts.items()]
        return compose_epsilon(fixed + comps, delta, accountant)

    low, high = 0.3, 1.0  # without fixed components, composed(high) <= target by construction
    while composed(high) > target_epsilon:
        low, high = high, high * 1.25
    for _ in range(12):  # the scale to within 0.7 / 4096
        mid = (low + high) / 2
        if composed(mid) <= target_epsilon:
            high = mid
        else:
            low = mid
    return {name: base[name] * high for name in parts}


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
    """Number of Poisson steps for ``epochs`` passes in expectation: ceil(epochs / q)."""
    return int(math.ceil(epochs / sample_rate))
