"""The one-run epsilon lower bound of Steinke, Nasr and Jagielski (NeurIPS 2023).

Setting: m canaries, each included in the training data independently with
probability 1/2.  After training, the auditor scores every canary, guesses
"in" for the k+ highest scores and "out" for the k- lowest, and abstains on
the rest: r = k+ + k- guesses, v of them correct.  Under (eps, delta)-DP the
number of correct guesses is stochastically dominated by Binomial(r, p) with
p = e^eps / (1 + e^eps), up to a delta term (their Theorem 5.2):

    P[V >= v] <= P[Bin(r, p) >= v] + 2 m delta * max_{1<=i<=v} P[v - i <= Bin(r, p) < v] / i.

epsilon_LB is the largest eps whose p-value is below alpha.  Several
(k+, k-) choices are tried; each is tested at alpha / (number of choices)
(Bonferroni), so the reported bound holds at level alpha for the best of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

EPS_SEARCH_MAX = 60.0  # beyond this p = e^eps/(1+e^eps) is 1 in double precision


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Probability of at least v correct guesses out of r under (eps, delta)-DP with m canaries."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"guesses (m={m}, r={r}, v={v}), expected 0 <= v <= r <= m")
    if eps < 0 or not 0 <= delta <= 1:
        raise ValueError(f"(eps, delta) = ({eps}, {delta}), expected eps >= 0 and 0 <= delta <= 1")
    if v == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, p))
    if delta == 0:
        return min(tail, 1.0)
    # P[v - i <= Bin < v] for i = 1..v, each divided by i; the largest of them.
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)  # P[Bin = v-1], P[Bin = v-2], ..., P[Bin = 0]
    window = np.cumsum(pmf) / np.arange(1, v + 1)
    return min(tail + 2.0 * m * delta * float(window.max()), 1.0)


def epsilon_for(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """The largest eps with p_value < alpha (0 when even eps = 0 is not rejected)."""
    if p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    low, high = 0.0, EPS_SEARCH_MAX
    if p_value(m, r, v, high, delta) < alpha:
        return high
    for _ in range(60):  # p_value grows with eps: bisection
        mid = 0.5 * (low + high)
        if p_value(m, r, v, mid, delta) < alpha:
            low = mid
        else:
            high = mid
    return low


def default_guess_counts(m: int) -> list[tuple[int, int]]:
    """(k+, k-) choices tried: guesses on both ends, and "in" guesses only."""
    sizes = [k for k in (5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000) if k <= m // 2]
    return [(k, k) for k in sizes] + [(k, 0) for k in sizes]


@dataclass
class AuditBound:
    """The audit's answer: ``epsilon_lb`` and the guesses that gave it."""

    epsilon_lb: float
    k_plus: int
    k_minus: int
    correct: int
    guesses: int
    choices: int
    alpha: float
    delta: float
    m: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def guesses_from_scores(scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int) -> tuple[int, int]:
    """(correct, guesses): "in" for the k+ highest scores, "out" for the k- lowest.  scores, included [m]."""
    order = np.argsort(-np.asarray(scores, dtype=float), kind="stable")
    top, bottom = order[:k_plus], order[len(order) - k_minus:] if k_minus else order[:0]
    correct = int(np.asarray(included)[top].sum()) + int((~np.asarray(included)[bottom]).sum())
    return correct, k_plus + k_minus


def epsilon_lower_bound(scores, included, delta: float, alpha: float = 0.05,
                        guess_counts: list[tuple[int, int]] | None = None) -> AuditBound:
    """epsilon_LB at level alpha from canary scores [m] (higher: more likely "in") and membership [m] (bool).

    Assumes each canary was included independently with probability 1/2 and
    that the scores were computed after training, from the trained model only.
    """
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    m = int(scores.shape[0])
    if included.shape != (m,):
        raise ValueError(f"included has shape {included.shape}, expected ({m},) like the scores")
    if not np.isfinite(scores).all():
        raise ValueError("canary scores contain NaN or inf, expected finite scores")
    choices = guess_counts or default_guess_counts(m)
    level = alpha / len(choices)
    best = AuditBound(0.0, 0, 0, 0, 0, len(choices), alpha, delta, m)
    for k_plus, k_minus in choices:
        if k_plus + k_minus > m:
            continue
        v, r = guesses_from_scores(scores, included, k_plus, k_minus)
        eps = epsilon_for(m, r, v, delta, level)
        if eps > best.epsilon_lb:
            best = AuditBound(eps, k_plus, k_minus, v, r, len(choices), alpha, delta, m)
    return best


def largest_reachable_bound(included, delta: float, alpha: float = 0.05) -> float:
    """epsilon_LB with every guess right (scores equal to membership): the most this audit can ever show.

    With m canaries the bound saturates far below large epsilons (for m = 1,000
    at delta 1e-5: 4.96 with exactly half included, 4.736 for the random
    membership draw of the demo's audit): a bound of 0 against an accounted 10
    then says little.
    """
    included = np.asarray(included, dtype=bool)
    return epsilon_lower_bound(included.astype(float), included, delta, alpha).epsilon_lb


def idealised_gaussian_bound(m: int, shift: float, delta: float, alpha: float = 0.05,
                             guess_counts: list[tuple[int, int]] | None = None) -> float:
    """epsilon_LB when scores are N(shift, 1) for included and N(0, 1) for excluded canaries, at expected counts.

    Half the canaries are in.  For a threshold guess the expected number of
    correct guesses among the top k is computed from the two normal tails, so
    the figure is deterministic (no sampling); it is what one run gives on average.
    """
    choices = guess_counts or default_guess_counts(m)
    level = alpha / len(choices)
    best = 0.0
    for k_plus, k_minus in choices:
        v = _expected_correct(m, shift, k_plus, top=True) + _expected_correct(m, shift, k_minus, top=False)
        best = max(best, epsilon_for(m, k_plus + k_minus, int(round(v)), delta, level))
    return best


def _expected_correct(m: int, shift: float, k: int, top: bool) -> float:
    """Expected correct guesses when guessing on the k most extreme of m scores (top: "in", else "out")."""
    if k == 0:
        return 0.0
    # The threshold s where the expected count of scores beyond it is k.
    def beyond(s):
        if top:
            return 0.5 * m * (stats.norm.sf(s - shift) + stats.norm.sf(s))
        return 0.5 * m * (stats.norm.cdf(s - shift) + stats.norm.cdf(s))
    low, high = -20.0, 20.0 + shift
    for _ in range(100):
        mid = 0.5 * (low + high)
        if (beyond(mid) > k) == top:
            low = mid
        else:
            high = mid
    s = 0.5 * (low + high)
    return 0.5 * m * (stats.norm.sf(s - shift) if top else stats.norm.cdf(s))


def gaussian_mechanism_epsilon(shift: float, delta: float) -> float:
    """The exact eps at delta of the Gaussian mechanism with sensitivity/sigma = shift (Balle and Wang 2018)."""
    def delta_at(eps):
        return stats.norm.cdf(-eps / shift + shift / 2) - math.exp(eps) * stats.norm.cdf(-eps / shift - shift / 2)
    low, high = 0.0, 200.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if delta_at(mid) > delta:
            low = mid
        else:
            high = mid
    return high
