"""Conditional WGAN-GP generator and critic for 28, 32 and 64 pixel images."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..models.layers import group_norm


@dataclass(frozen=True)
class GANConfig:
    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10  # 0: unconditional
    latent_dim: int = 64
    width: int = 64

    def to_dict(self) -> dict:
        return asdict(self)


class Generator(nn.Module):
    """z [N, latent_dim], y [N] -> images [N,C,H,W] in [-1, 1].  Never sees data: post-processing of the critic."""

    def __init__(self, config: GANConfig):
        super().__init__()
        self.config = config
        self.start = config.image_size // 4
        w = config.width
        self.embed = nn.Embedding(max(config.num_classes, 1), config.latent_dim)
        self.fc = nn.Linear(config.latent_dim, 2 * w * self.start * self.start)
        self.up1 = nn.Conv2d(2 * w, w, 3, padding=1)
        self.norm1 = group_norm(w, 8)
        self.up2 = nn.Conv2d(w, w // 2, 3, padding=1)
        self.norm2 = group_norm(w // 2, 8)
        self.out = nn.Conv2d(w // 2, config.in_channels, 3, padding=1)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = z * (1 + self.embed(y)) if self.config.num_classes else z
        # the channel count is explicit: a Poisson batch may be empty, and view(0, -1, ...) is ambiguous
        h = F.relu(self.fc(h)).view(z.shape[0], 2 * self.config.width, self.start, self.start)
        h = F.relu(self.norm1(self.up1(F.interpolate(h, scale_factor=2, mode="nearest"))))
        h = F.relu(self.norm2(self.up2(F.interpolate(h, size=(self.config.image_size,) * 2, mode="nearest"))))
        return torch.tanh(self.out(h))


class Critic(nn.Module):
    """images [N,C,H,W], y [N] -> scores [N].  No normalisation layer, so each score depends on its own input only."""

    def __init__(self, config: GANConfig):
        super().__init__()
        self.config = config
        w = config.width
        self.conv1 = nn.Conv2d(config.in_channels, w // 2, 4, stride=2, padding=1)
        self.conv2 = nn.Conv2d(w // 2, w, 4, stride=2, padding=1)
        self.conv3 = nn.Conv2d(w, 2 * w, 3, padding=1)
        self.linear = nn.Linear(2 * w, 1)
        self.embed = nn.Embedding(max(config.num_classes, 1), 2 * w)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.conv1(x), 0.2)
        h = F.leaky_relu(self.conv2(h), 0.2)
        h = F.leaky_relu(self.conv3(h), 0.2).mean(dim=(2, 3))
        score = self.linear(h).squeeze(-1)
        if self.config.num_classes:
            score = score + (self.embed(y) * h).sum(dim=-1)  # projection conditioning
        return score
