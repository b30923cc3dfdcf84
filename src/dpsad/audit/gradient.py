"""White-box audit of the DP-SGD mechanism with gradient (Dirac) canaries.

This audits the mechanism, not the pipeline: canary j is a record whose
gradient is a fixed direction, coordinate j of a parameter vector with one
coordinate per canary, scaled to twice the clip norm so clipping brings it to
exactly C (the largest contribution a record may make).  Records that are not
canaries are assumed to add nothing along these coordinates (the canary
directions are orthogonal to them), so only canaries are simulated.

Each step draws a Poisson batch with the run's own :class:`PoissonSampler`
and passes it through the run's own :class:`DPSGD` engines (several when the
updates share a batch, like DP-SAD's student and discriminator); SGD with
learning rate 1 turns the privatised gradients into parameters.  The score of
canary j is the movement of coordinate j in units of C / expected batch,
combining the engines with weights 1 / sigma_i^2 (the optimal test for
independent Gaussian noise).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..privacy.mechanism.dpsgd import DPSGD, PoissonSampler, dp_generators


class CanaryCoordinates(nn.Module):
    """One parameter per canary; forward(one_hot [N, m]) -> [N]."""

    def __init__(self, m: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(m))

    def forward(self, one_hot: torch.Tensor) -> torch.Tensor:
        return (self.weight * one_hot).sum(-1)


def dirac_loss(clip_norm: float):
    """Per-record loss whose gradient is -2C along the record's own coordinate: clipped to norm C, and
    a descent step moves that coordinate up by C / expected batch."""

    def loss(call, one_hot):
        return -2.0 * clip_norm * call(one_hot)

    return loss


def gradient_canary_scores(included: np.ndarray, *, sample_rate: float, steps: int, noise_multipliers: list[float],
                           clip_norm: float, expected_batch_size: float, noise_seed: int | None = None,
                           progress: bool = False) -> np.ndarray:
    """Scores [m] of gradient canaries after ``steps`` DP-SGD steps; ``included`` [m] bool says who is in the data.

    ``noise_multipliers``: one DPSGD engine per entry, all reading the same
    Poisson batch (a zero multiplier is an engine without noise, which then
    decides the score alone).
    """
    included = np.asarray(included, dtype=bool)
    m = int(included.shape[0])
    members = torch.from_numpy(np.flatnonzero(included))
    randomness = dp_generators(noise_seed)
    models = [CanaryCoordinates(m) for _ in noise_multipliers]
    engines = [DPSGD(model, dirac_loss(clip_norm), noise_multiplier=sigma, clip_norm=clip_norm,
                     expected_batch_size=expected_batch_size, noise_generator=randomness.noise, microbatch_size=256)
               for model, sigma in zip(models, noise_multipliers)]
    sampler = PoissonSampler(max(len(members), 1), sample_rate, randomness.sampling)
    eye = torch.eye(m)
    for _ in tqdm(range(steps), desc="gradient canaries", disable=not progress, mininterval=2.0):
        batch = members[sampler.sample()] if len(members) else members
        rows = eye[batch]
        for model, engine in zip(models, engines):
            engine.step_gradients((rows,))
            with torch.no_grad():
                model.weight -= model.weight.grad
    moves = [(model.weight.detach() * expected_batch_size / clip_norm).numpy() for model in models]
    exact = [move for move, sigma in zip(moves, noise_multipliers) if sigma == 0.0]
    if exact:
        return exact[0]
    weights = np.array([1.0 / s ** 2 for s in noise_multipliers])
    return sum(w * move for w, move in zip(weights, moves)) / weights.sum()
