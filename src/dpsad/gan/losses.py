"""WGAN-GP losses, one value per example (the critic's is what DP-SGD clips)."""

from __future__ import annotations

import torch
from torch.func import grad


def critic_example_loss(gp_weight: float):
    """Per-record critic loss: D(fake) - D(real) + lambda * (||grad_x D(x_hat)||_2 - 1)^2.

    example: real [C,H,W], fake [C,H,W] (data-independent), rho [] in [0,1], y [].
    The gradient penalty reads the private image through x_hat, so it is part
    of this record's loss and is clipped with it.
    """

    def loss(call, real, fake, rho, y):
        y1 = y[None]
        x_hat = rho * real + (1 - rho) * fake

        def score(image):
            return call(image[None], y1).sum()

        input_grad = grad(score)(x_hat)
        penalty = (input_grad.flatten().norm() - 1.0) ** 2
        return call(fake[None], y1).sum() - call(real[None], y1).sum() + gp_weight * penalty

    return loss


def generator_loss(critic, fake: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """-D(G(z)) per example.  [N]."""
    return -critic(fake, y)
