"""The noisy gradient of a DP step projected onto the directions public data says matter (``dp.subspace``).

PDP-SGD (Zhou, Wu and Banerjee, "Bypassing the ambient dimension", ICLR 2021): the top k right singular vectors
of the per-example gradients of the same loss on m public examples, at the current weights, span a basis V
[k, P] (P: trained parameters).  After the mechanism has written the noisy mean gradient g to ``.grad``,
g <- V^T V g, so the noise that reaches the weights falls from sigma C sqrt(P) to sigma C sqrt(k) (over the
expected batch), while the part of the records' signal outside the public directions is lost.

Privacy: V is a function of the current weights (the outputs of earlier noisy steps) and public records only,
and the projection reads nothing but the mechanism's output: post-processing.  The ledger is that of the same
run without it; the mechanism's code (:mod:`dpsad.privacy.mechanism`) is not touched.

Assumptions: the public examples are public (the ``public`` split, never the private one), and their timesteps
and diffusion noise come from the loop's public generator, not from the secret ones.  Where the loss reads other
models (the DP-SAD student's reads the public teacher and the DP discriminator, the discriminator's the student),
those are public or the outputs of earlier noisy steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..privacy.mechanism.dpsgd import per_example_gradients

PUBLIC_EXAMPLES = 128  # m: public per-example gradients a basis is estimated from (the most directions it can have)
REFRESHES = 20  # bases a training computes: each costs about one step's compute on m public examples
NOISE_TO_CLIP = 0.5  # k is the largest number of directions whose noise, in norm, is at most this share of C


@dataclass(frozen=True)
class SubspacePlan:
    """k directions, estimated from ``public_examples`` public examples every ``refresh_every`` steps."""

    k: int
    public_examples: int
    refresh_every: int


def subspace_plan(*, expected_batch: float, noise_multiplier: float, steps: int, public_records: int) -> SubspacePlan:
    """The rule: it reads the DP plan (batch, noise and steps, themselves from n, the budget and the compute) and
    the size of the public split, nothing else.  The projected noise of a step has norm sigma C sqrt(k) / B; k is
    the largest with that at most :data:`NOISE_TO_CLIP` C, and at most the m public examples a basis is built on."""
    m = max(1, min(PUBLIC_EXAMPLES, public_records))
    by_noise = math.floor((NOISE_TO_CLIP * expected_batch / noise_multiplier) ** 2) if noise_multiplier > 0 else m
    return SubspacePlan(k=max(1, min(m, by_noise)), public_examples=m, refresh_every=max(1, math.ceil(steps / REFRESHES)))


def public_basis(model: nn.Module, example_loss, public_batch: tuple[torch.Tensor, ...], k: int) -> torch.Tensor:
    """[k, P] orthonormal rows: the top-k right singular vectors of the public examples' per-example gradients
    (the model's trainable parameters in ``named_parameters`` order, flattened)."""
    grads = per_example_gradients(model, example_loss, public_batch)
    flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1).double()
    # from the m x m Gram matrix (m << P): F F^T = U S^2 U^T, so the right singular vectors are U^T F / S
    squares, left = torch.linalg.eigh(flat @ flat.T)
    order = torch.argsort(squares, descending=True)[:k]
    kept = order[squares[order] > 1e-12 * squares.max().clamp(min=1e-300)]  # no direction of a zero gradient
    right = (left[:, kept].T @ flat) / squares[kept].sqrt()[:, None]
    return right.to(grads[next(iter(grads))].dtype)


def project_gradients_(model: nn.Module, basis: torch.Tensor) -> None:
    """Replace the trainable parameters' ``.grad`` (the mechanism's noisy output) by its projection V^T V g."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    projected = basis.T @ (basis @ flat)
    offset = 0
    for p in params:
        p.grad.copy_(projected[offset:offset + p.numel()].reshape(p.shape))
        offset += p.numel()


class PublicSubspace:
    """One model's projection through a training: the basis estimated from ``draw_public(m)`` (m public examples,
    the inputs of ``example_loss``) at the current weights, again every ``plan.refresh_every`` steps.

    Call :meth:`refresh` before the step's gradients (at the weights they are taken at), :meth:`project` after
    the mechanism has written the noisy gradient.  A resumed training estimates a basis at its first step."""

    def __init__(self, model: nn.Module, example_loss, plan: SubspacePlan, draw_public: Callable[[int], tuple]):
        self.model, self.example_loss, self.plan, self.draw_public = model, example_loss, plan, draw_public
        self.basis: torch.Tensor | None = None

    def refresh(self, step: int) -> None:
        if self.basis is None or step % self.plan.refresh_every == 0:
            self.basis = public_basis(self.model, self.example_loss, self.draw_public(self.plan.public_examples),
                                      self.plan.k)

    def project(self) -> None:
        project_gradients_(self.model, self.basis)
