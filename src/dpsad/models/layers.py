"""Building blocks shared by the UNet and the discriminator."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps.  t: [N] -> [N, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    """GroupNorm with the largest group count <= ``groups`` that divides ``channels``."""
    g = min(groups, channels)
    while channels % g:
        g -= 1
    return nn.GroupNorm(g, channels)


class ResBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm/SiLU, conditioned on an embedding.  [N,C,H,W] -> [N,C_out,H,W]."""

    def __init__(self, in_ch: int, out_ch: int, emb_dim: int, groups: int):
        super().__init__()
        self.norm1 = group_norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.emb = nn.Linear(emb_dim, out_ch)
        self.norm2 = group_norm(out_ch, groups)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class SelfAttention(nn.Module):
    """Single-head self-attention over spatial positions.  [N,C,H,W] -> [N,C,H,W]."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(n, 3, c, h * w).unbind(1)
        weights = torch.softmax(torch.einsum("ncq,nck->nqk", q, k) / math.sqrt(c), dim=-1)
        out = torch.einsum("nqk,nck->ncq", weights, v).reshape(n, c, h, w)
        return x + self.out(out)
