"""MoCo v2 (He et al. 2020; Chen et al. 2020): query and key encoders, momentum, queue, InfoNCE.

With labels, a supervised contrastive term (Khosla et al. 2020) over the same keys and queue can join the
instance loss: every key of the same class counts as a positive.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..models.layers import group_norm


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.norm1 = group_norm(out_ch, 8)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.norm2 = group_norm(out_ch, 8)
        self.skip = (nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), group_norm(out_ch, 8))
                     if stride != 1 or in_ch != out_ch else nn.Identity())

    def forward(self, x):
        h = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(h)) + self.skip(x))


POOLINGS = ("mean", "pyramid")


class ResNetEncoder(nn.Module):
    """Small ResNet with GroupNorm: [N,C,H,W] -> [N, out_dim].

    ``pooling``: ``mean`` (global average, out_dim = widths[-1]) or ``pyramid`` (the global average and the
    averages of the last map's four quadrants, out_dim = 5 * widths[-1]; on a map of odd size the quadrants share
    the middle row and column, as ``adaptive_avg_pool2d`` splits it).  A digit's class lives in where its strokes
    are (a 6 against a 9, a 7 against a 1), which a global average alone blurs.
    """

    def __init__(self, in_channels: int, widths=(32, 64, 128), pooling: str = "mean"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling = '{pooling}', expected one of {', '.join(POOLINGS)}")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), group_norm(widths[0], 8), nn.ReLU())
        layers, current = [], widths[0]
        for i, width in enumerate(widths):
            layers += [BasicBlock(current, width, 1 if i == 0 else 2), BasicBlock(width, width, 1)]
            current = width
        self.layers = nn.Sequential(*layers)
        self.pooling = pooling
        self.out_dim = current * (5 if pooling == "pyramid" else 1)

    def forward(self, x):
        h = self.layers(self.stem(x))
        pooled = h.mean(dim=(2, 3))
        if self.pooling == "pyramid":
            pooled = torch.cat([pooled, F.adaptive_avg_pool2d(h, 2).flatten(1)], dim=1)
        return pooled


class MoCo(nn.Module):
    """Query encoder (backbone + MLP head), a momentum key encoder and a FIFO queue of negative keys.

    The queue also keeps each key's label (-1: none, as for the random keys it starts with), for ``label_weight``.
    """

    def __init__(self, in_channels: int, feature_dim: int = 64, queue_size: int = 1024, momentum: float = 0.99,
                 temperature: float = 0.2, widths=(32, 64, 128), pooling: str = "mean"):
        super().__init__()
        backbone = ResNetEncoder(in_channels, widths, pooling)
        # BatchNorm in the head removes the component every image shares; without it the GroupNorm encoder
        # starts (and stays) collapsed: all features nearly equal, the loss near log(queue).
        self.query = nn.Sequential(backbone, nn.Linear(backbone.out_dim, backbone.out_dim), nn.BatchNorm1d(backbone.out_dim),
                                   nn.ReLU(), nn.Linear(backbone.out_dim, feature_dim))
        self.key = copy.deepcopy(self.query)
        for p in self.key.parameters():
            p.requires_grad_(False)
        self.momentum = momentum
        self.temperature = temperature
        self.register_buffer("queue", F.normalize(torch.randn(queue_size, feature_dim), dim=1))
        self.register_buffer("queue_labels", torch.full((queue_size,), -1, dtype=torch.long))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    @property
    def backbone(self) -> ResNetEncoder:
        return self.query[0]

    @torch.no_grad()
    def momentum_update(self) -> None:
        """key <- m * key + (1 - m) * query, parameter by parameter."""
        for k, q in zip(self.key.parameters(), self.query.parameters()):
            k.mul_(self.momentum).add_(q.detach(), alpha=1 - self.momentum)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """Write ``keys`` [B, D] and their ``labels`` [B] (-1 when None) over the oldest entries (first in, first
        out, wrapping around)."""
        size = self.queue.shape[0]
        ptr = int(self.queue_ptr)
        idx = (torch.arange(keys.shape[0], device=keys.device) + ptr) % size
        self.queue[idx] = keys
        self.queue_labels[idx] = -1 if labels is None else labels
        self.queue_ptr.fill_((ptr + keys.shape[0]) % size)

    @torch.no_grad()
    def shuffled_keys(self, view_k: torch.Tensor, groups: int = 4) -> torch.Tensor:
        """Keys [B, D] computed in ``groups`` random subsets of the batch (shuffling BN, MoCo's remedy on one
        device): a key's BatchNorm statistics then differ from its query's, so the batch cannot give the
        positive away."""
        n = view_k.shape[0]
        order = torch.randperm(n, device=view_k.device)
        chunks = order.chunk(max(1, min(groups, n // 2)))  # every subset holds at least 2 examples
        keys = torch.cat([self.key(view_k[idx]) for idx in chunks])
        return keys[torch.argsort(order)]

    def forward(self, view_q: torch.Tensor, view_k: torch.Tensor, labels: torch.Tensor | None = None,
                label_weight: float = 0.0) -> torch.Tensor:
        """Loss per example for a batch of two views [B,C,H,W] -> [B]: InfoNCE, or with ``labels`` [B]
        ``(1 - label_weight) * InfoNCE + label_weight * supervised contrastive``."""
        if label_weight > 0 and labels is None:
            raise ValueError(f"label_weight = {label_weight} needs the images' labels, got none")
        q = F.normalize(self.query(view_q), dim=1)
        with torch.no_grad():
            self.momentum_update()
            k = F.normalize(self.shuffled_keys(view_k), dim=1)
        queue, queue_labels = self.queue.clone().detach(), self.queue_labels.clone()
        loss = info_nce(q, k, queue, self.temperature)
        if label_weight > 0:
            supervised = supervised_contrastive(q, torch.cat([k, queue]), labels,
                                                torch.cat([labels, queue_labels]), self.temperature)
            loss = (1 - label_weight) * loss + label_weight * supervised
        self.enqueue(k, labels)
        return loss


def info_nce(q: torch.Tensor, k: torch.Tensor, negatives: torch.Tensor, temperature: float) -> torch.Tensor:
    """-log( exp(q.k/T) / (exp(q.k/T) + sum_n exp(q.n/T)) ) per example.  q, k: [B,D]; negatives: [K,D] -> [B]."""
    positive = (q * k).sum(dim=1, keepdim=True)
    logits = torch.cat([positive, q @ negatives.t()], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device), reduction="none")


def supervised_contrastive(q: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, key_labels: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """Mean over a query's positives (the keys of its own label) of -log softmax(q.keys / T).  -> [B].

    q: [B,D]; keys: [M,D]; labels: [B]; key_labels: [M], -1 for keys of no label (never a positive).  The batch's
    own keys come first in ``keys``, so each query has at least its own key as a positive.
    """
    log_prob = F.log_softmax(q @ keys.t() / temperature, dim=1)
    positive = (labels[:, None] == key_labels[None, :]) & (labels[:, None] >= 0)
    count = positive.sum(dim=1)
    if bool((count == 0).any()):
        raise ValueError("supervised_contrastive: a query has no positive key (labels must be >= 0)")
    return -(log_prob * positive).sum(dim=1) / count
