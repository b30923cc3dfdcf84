"""Classifiers used to score synthetic data: the evaluator network and the downstream models.

Model selection (epoch, regularisation) only ever sees a held-out part of the
*training* source (synthetic data for utility, the private split for the
evaluator); the real test split is used once, after selection, to report.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..models.layers import group_norm
from ..runtime.eager_optimizers import eager


class ConvNet(nn.Module):
    """Small CNN: [N,C,H,W] in [0,1] -> logits [N,K]; ``features`` gives the 128-d penultimate layer."""

    num_features = 128

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), group_norm(32, 8), nn.SiLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), group_norm(64, 8), nn.SiLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), group_norm(64, 8), nn.SiLU(), nn.AdaptiveAvgPool2d(2),
            nn.Flatten(), nn.Linear(256, self.num_features), nn.SiLU(),
        )
        self.head = nn.Linear(self.num_features, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


def to_float(images: np.ndarray) -> torch.Tensor:
    """uint8 [N,H,W,C] -> float [N,C,H,W] in [0,1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0


def holdout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (fit, select) index split of range(n); the selection part has at least one element."""
    order = np.random.default_rng(seed).permutation(n)
    n_select = max(1, int(round(fraction * n)))
    return order[n_select:], order[:n_select]


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(x), batch):
        correct += int((model(x[start:start + batch]).argmax(1) == y[start:start + batch]).sum())
    return correct / max(1, len(x))


@dataclass
class Selected:
    model: nn.Module
    epoch: int
    select_accuracy: float


def fit_select(model: nn.Module, x_fit, y_fit, x_sel, y_sel, *, epochs: int, lr: float, batch: int, seed: int) -> Selected:
    """Train with Adam and a cosine learning-rate decay over ``epochs``; keep the epoch whose accuracy on
    (x_sel, y_sel) is best.  Never sees test data."""
    gen = torch.Generator().manual_seed(seed)
    opt = eager(torch.optim.Adam)(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    best = Selected(copy.deepcopy(model), 0, -1.0)
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(x_fit), generator=gen)
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            loss = F.cross_entropy(model(x_fit[idx]), y_fit[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        schedule.step()
        acc = accuracy(model, x_sel, y_sel)
        if acc > best.select_accuracy:
            best = Selected(copy.deepcopy(model), epoch, acc)
    best.model.eval()
    return best
