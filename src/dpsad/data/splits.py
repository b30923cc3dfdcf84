"""Deterministic, stratified splitting into private / public / test."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DpsadError


@dataclass(frozen=True)
class SplitFractions:
    """Fractions of the pool.  ``test`` applies only to sources without an official test split;
    ``public`` and ``private`` are fractions of what remains (they may sum to less than 1, to subsample)."""

    test: float
    public: float
    private: float

    def check(self, has_official_test: bool) -> None:
        for name in ("test", "public", "private"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise DpsadError(f"split fraction {name}_fraction = {value}, expected a number in [0, 1]")
        total = self.public + self.private
        if total > 1.0 + 1e-9:
            raise DpsadError(
                f"public_fraction + private_fraction = {total:g}, expected at most 1 (they share the non-test pool)"
            )
        if self.private <= 0.0:
            raise DpsadError(f"private_fraction = {self.private}, expected more than 0: the private split cannot be empty")
        if not has_official_test and not 0.0 < self.test < 1.0:
            raise DpsadError(f"test_fraction = {self.test}, expected a number in (0, 1) for a source without a test split")


def stratified_partition(labels: np.ndarray | None, n: int, fractions: list[float], seed: int) -> list[np.ndarray]:
    """Partition range(n) into len(fractions) disjoint sorted index arrays.

    Within each class (or over everything when ``labels`` is None) the order is
    a seeded permutation and part k takes round(fraction_k * class size)
    indices, so each part keeps the class proportions.  Fractions summing to
    less than 1 leave the remainder unused.
    """
    rng = np.random.default_rng(seed)
    groups = [np.arange(n)] if labels is None else [np.flatnonzero(labels == c) for c in np.unique(labels)]
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for group in groups:
        order = rng.permutation(group)
        start = 0
        cumulative = 0.0
        for k, fraction in enumerate(fractions):
            cumulative += fraction
            stop = min(len(order), int(round(cumulative * len(order))))
            parts[k].append(order[start:stop])
            start = stop
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]
