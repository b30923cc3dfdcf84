"""The DP-SAD discriminator: tells teacher outputs from student outputs (paper Fig. 2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .layers import group_norm, timestep_embedding


@dataclass(frozen=True)
class DiscriminatorConfig:
    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
    base_channels: int = 32
    groups: int = 8
    time_embed_dim: int = 64

    def to_dict(self) -> dict:
        return asdict(self)


class Discriminator(nn.Module):
    """x: [N,C,H,W] model outputs at step t, t: [N], y: [N] -> logits [N, 2] (index 0: teacher, 1: student).

    Conditioned on the timestep and the class (projection), GroupNorm only so
    that each example's output depends on that example alone.
    """

    def __init__(self, config: DiscriminatorConfig):
        super().__init__()
        self.config = config
        ch, groups = config.base_channels, config.groups
        self.conv1 = nn.Conv2d(config.in_channels, ch, 3, stride=2, padding=1)
        self.norm1 = group_norm(ch, groups)
        self.conv2 = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.norm2 = group_norm(2 * ch, groups)
        self.conv3 = nn.Conv2d(2 * ch, 2 * ch, 3, stride=2, padding=1)
        self.time_proj = nn.Linear(config.time_embed_dim, 2 * ch)
        self.class_embed = nn.Embedding(config.num_classes + 1, 2 * ch)
        self.head = nn.Linear(2 * ch, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.norm1(self.conv1(x)))
        h = F.silu(self.norm2(self.conv2(h)))
        h = F.silu(self.conv3(h)).mean(dim=(2, 3))
        h = h + self.time_proj(timestep_embedding(t, self.config.time_embed_dim))
        h = h * (1 + self.class_embed(y))
        return self.head(h)
