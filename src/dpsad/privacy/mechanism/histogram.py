"""Private Evolution's mechanism: per iteration, one Gaussian-noised histogram of nearest-candidate votes.

Assumptions, checked by the tests: add/remove adjacency of one private record; every record casts exactly
one vote, for the candidate nearest to its embedding among the candidates of its own label, so adding or
removing one record changes one count by one (L2 sensitivity 1); every count gets N(0, sigma^2) from a
secret generator.  The ``iterations`` histograms of a run compose as that many Gaussian mechanisms (the
ledger's ``gaussian`` entry with ``steps`` = iterations).  The embedding must be a fixed function of public
data or of a DP training whose spending is upstream in the run's ledger (pixels, or the encoder of a public or a
DP teacher), and the candidates drawn from such a generator or post-processing of earlier noisy histograms:
nothing else of the private records may leave the stage.

The plan (:func:`plan_pe`) reads n, the number of classes, the budget and the configuration, never a record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import accounting
from ..accounting import SGMComponent
from ..accounting import calibration_accountant

SENSITIVITY = 1.0  # one record, one vote


@dataclass(frozen=True)
class PePlan:
    """Iterations T, the noise multiplier of each histogram, candidates per class and the vote threshold."""

    iterations: int
    noise_multiplier: float
    candidates_per_class: int
    threshold: float
    reason: str


def plan_pe(n: int, classes: int, target_epsilon: float, delta: float, *, max_iterations: int, votes_per_noise: float,
            min_candidates_per_class: int, max_candidates_per_class: int, threshold_sigmas: float,
            accountant: str = accounting.DEFAULT_ACCOUNTANT, fixed: list[SGMComponent] | None = None) -> PePlan:
    """The most iterations (at most ``max_iterations``) that still leave each of ``min_candidates_per_class``
    candidates an expected n / (classes x candidates) votes of at least ``votes_per_noise`` x sigma; then as
    many candidates per class as that ratio allows (at most ``max_candidates_per_class``).  When even one
    iteration cannot reach it, one iteration with the fewest candidates: the noise then dominates the counts,
    and the log says so.  The threshold is ``threshold_sigmas`` x sigma.  n is public (as for DP-SGD)."""
    if n < 1 or classes < 1:
        raise ValueError(f"n = {n}, classes = {classes}, expected at least one record and one class")
    per_class = n / classes
    chosen = None
    for iterations in range(max_iterations, 0, -1):
        sigma = accounting.noise_for_target(target_epsilon, delta, 1.0, iterations,
                                            calibration_accountant(accountant), list(fixed or ()))
        room = math.floor(per_class / (votes_per_noise * sigma))
        chosen = (iterations, sigma, room)
        if room >= min_candidates_per_class:
            break
    iterations, sigma, room = chosen
    candidates = max(min_candidates_per_class, min(max_candidates_per_class, room))
    ratio = per_class / candidates / sigma
    reason = (f"{iterations} iteration(s), {candidates} candidates a class: {per_class:.0f} records a class give "
              f"{ratio:.2f} sigma of votes a candidate" + ("" if room >= min_candidates_per_class else
                                                            f", below the aim {votes_per_noise:g}"))
    return PePlan(iterations, sigma, candidates, threshold_sigmas * sigma, reason)


@torch.no_grad()
def nearest_votes(private: torch.Tensor, private_labels: torch.Tensor, candidates: torch.Tensor,
                  candidate_labels: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Each private record's vote for its nearest candidate (squared L2) of the same label.

    private [n, D], private_labels [n], candidates [m, D], candidate_labels [m] -> counts int64 [m] summing to n.
    A label with no candidate is refused (the record would have no vote to cast)."""
    if set(private_labels.tolist()) - set(candidate_labels.tolist()):
        raise ValueError("a private record's label has no candidate, expected candidates for every label")
    counts = torch.zeros(len(candidates), dtype=torch.int64)
    other_label = private_labels[:, None] != candidate_labels[None, :]
    for start in range(0, len(private), chunk):
        # exact per pair (no matrix-product form), so a record's distances do not depend on its chunk's other rows
        distance = torch.cdist(private[start:start + chunk].double(), candidates.double(),
                               compute_mode="donot_use_mm_for_euclid_dist")
        distance = distance.nan_to_num(nan=1e300, posinf=1e300)  # a broken candidate never takes every vote
        distance[other_label[start:start + chunk]] = math.inf
        counts += torch.bincount(distance.argmin(dim=1), minlength=len(candidates))
    return counts


def noisy_histogram(counts: torch.Tensor, noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """counts int [m] + N(0, (sigma x sensitivity)^2) each, float64 [m]; ``generator`` holds a secret seed."""
    noise = torch.randn(counts.shape, generator=generator, dtype=torch.float64)
    return counts.double() + noise_multiplier * SENSITIVITY * noise


def selection_weights(noisy: torch.Tensor, labels: torch.Tensor, threshold: float) -> torch.Tensor:
    """Post-processing: counts below ``threshold`` set to 0, the rest normalised within each label; a label whose
    counts all fall below it keeps its candidates equally likely.  noisy [m], labels [m] -> float64 [m]."""
    kept = torch.where(noisy >= threshold, noisy, torch.zeros_like(noisy))
    weights = torch.zeros_like(kept)
    for label in labels.unique():
        member = labels == label
        total = kept[member].sum()
        weights[member] = kept[member] / total if total > 0 else 1.0 / int(member.sum())
    return weights
