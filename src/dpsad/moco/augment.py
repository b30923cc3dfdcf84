"""Batched, seeded image augmentations for contrastive learning on small images.

Every transform draws its parameters per example from the given generator and
acts on that example alone.  Input and output: float [N,C,H,W] in [-1, 1].
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def _uniform(n: int, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen)


def random_affine(x: torch.Tensor, gen: torch.Generator, *, max_rotate: float = 15.0, scale=(0.8, 1.15),
                  max_translate: float = 0.12, flip: bool = False) -> torch.Tensor:
    """Random rotation, isotropic scale (a resized crop when > 1), translation and optional horizontal flip."""
    n = x.shape[0]
    angle = _uniform(n, -max_rotate, max_rotate, gen) * math.pi / 180
    s = _uniform(n, scale[0], scale[1], gen)
    tx, ty = _uniform(n, -max_translate, max_translate, gen) * 2, _uniform(n, -max_translate, max_translate, gen) * 2
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0) if flip else torch.ones(n)
    cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
    theta = torch.stack([torch.stack([cos * sign, -sin, tx], 1), torch.stack([sin * sign, cos, ty], 1)], 1)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    return F.grid_sample(x + 1, grid, padding_mode="zeros", align_corners=False) - 1  # pad with black (-1)


def colour_jitter(x: torch.Tensor, gen: torch.Generator, strength: float = 0.4) -> torch.Tensor:
    """Random brightness and contrast per example (and saturation for colour images)."""
    n = x.shape[0]
    brightness = _uniform(n, -strength, strength, gen).to(x.device)[:, None, None, None]
    contrast = _uniform(n, 1 - strength, 1 + strength, gen).to(x.device)[:, None, None, None]
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    out = (x - mean) * contrast + mean + brightness
    if x.shape[1] == 3:
        grey = out.mean(dim=1, keepdim=True)
        saturation = _uniform(n, 1 - strength, 1 + strength, gen).to(x.device)[:, None, None, None]
        to_grey = (torch.rand(n, generator=gen) < 0.2).to(x.device)[:, None, None, None]
        out = torch.where(to_grey, grey.expand_as(out), grey + (out - grey) * saturation)
    return out.clamp(-1, 1)


def random_erase(x: torch.Tensor, gen: torch.Generator, probability: float = 0.5, max_fraction: float = 0.25) -> torch.Tensor:
    """Blank a random rectangle in some examples (cutout)."""
    n, _, h, w = x.shape
    out = x.clone()
    apply = torch.rand(n, generator=gen) < probability
    sizes = (torch.rand(n, 2, generator=gen) * max_fraction ** 0.5 * torch.tensor([h, w])).long().clamp(min=1)
    corners = (torch.rand(n, 2, generator=gen) * torch.tensor([h, w])).long()
    for i in torch.nonzero(apply).flatten().tolist():
        r, c = corners[i].tolist()
        dh, dw = sizes[i].tolist()
        out[i, :, r:r + dh, c:c + dw] = -1.0
    return out


def gaussian_noise(x: torch.Tensor, gen: torch.Generator, std: float = 0.1) -> torch.Tensor:
    return (x + std * torch.randn(x.shape, generator=gen).to(x.device)).clamp(-1, 1)


def two_views(x: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent augmentations of each image (the query and key views)."""
    colour = x.shape[1] == 3

    def view(batch):
        out = random_affine(batch, gen, flip=colour)
        out = colour_jitter(out, gen)
        out = random_erase(out, gen)
        return gaussian_noise(out, gen, 0.05)

    return view(x), view(x)
