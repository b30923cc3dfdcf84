"""The public generator's two calls in Private Evolution: fresh images, and variations of given ones.

A variation re-noises an image to a share ``strength`` of the diffusion's timesteps and denoises it with the
public teacher (SDEdit): a small strength keeps the image's shape, 1 draws a new image.  Nothing here reads a
private record; the parents are chosen from noisy histograms (post-processing).
"""

from __future__ import annotations

import math

import torch

from ..sampling.solvers import ddim_step


def strength_timesteps(num_timesteps: int, strength: float, steps: int) -> list[int]:
    """DDIM timesteps from ``strength`` x (T - 1) down to 0, about ``strength`` x ``steps`` of them (at least 2)."""
    top = max(1, round(strength * (num_timesteps - 1)))
    count = max(2, math.ceil(strength * steps))
    return sorted({round(top * i / (count - 1)) for i in range(count)}, reverse=True)


@torch.no_grad()
def generate(model, diffusion, labels: torch.Tensor, *, parents: torch.Tensor | None, strength: float, steps: int,
             eta: float, generator: torch.Generator, batch: int = 250) -> torch.Tensor:
    """Images [N,C,H,W] in [-1, 1] for ``labels`` [N] (the model's null class for unconditional runs): fresh when
    ``parents`` is None, else variations of ``parents`` [N,C,H,W] at ``strength`` in (0, 1]."""
    cfg = model.config
    device = labels.device
    seq = strength_timesteps(diffusion.num_timesteps, 1.0 if parents is None else strength, steps)
    out = []
    for start in range(0, len(labels), batch):
        y = labels[start:start + batch]
        noise = torch.randn((len(y), cfg.in_channels, cfg.image_size, cfg.image_size), generator=generator,
                            device=device)
        if parents is None:
            x = noise
        else:
            t = torch.full((len(y),), seq[0], dtype=torch.long, device=device)
            x = diffusion.q_sample(parents[start:start + batch].to(device), t, noise)
        for i, step in enumerate(seq):
            prev_step = seq[i + 1] if i + 1 < len(seq) else -1
            x = ddim_step(model, diffusion, x, step, prev_step, y, eta=eta, guidance=0.0, generator=generator)
        out.append(x.clamp(-1.0, 1.0))
    return torch.cat(out)
