"""Fidelity in the evaluator's feature and class space: FID, Inception Score, precision and recall.

FID and IS come from torchmetrics with the evaluator as a custom feature
extractor (named ``fid_evaluator`` / ``is_evaluator``: they are *not*
Inception-v3 figures and are comparable only within one dataset).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .classifiers import to_float


class _Features(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.num_features = net.num_features

    def forward(self, x):
        return self.net.features(x)


class _Logits(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def features(net, images: np.ndarray, batch: int = 500) -> np.ndarray:
    x = to_float(images)
    return torch.cat([net.features(x[s:s + batch]) for s in range(0, len(x), batch)]).numpy().astype(np.float32)


@torch.no_grad()
def fid(net, real: np.ndarray, fake: np.ndarray) -> float:
    from torchmetrics.image.fid import FrechetInceptionDistance

    metric = FrechetInceptionDistance(feature=_Features(net).eval(), normalize=True)
    for images, is_real in ((real, True), (fake, False)):
        x = to_float(images)
        for s in range(0, len(x), 500):
            metric.update(x[s:s + 500], real=is_real)
    return float(metric.compute())


@torch.no_grad()
def inception_score(net, images: np.ndarray, splits: int = 10, seed: int = 0) -> tuple[float, float]:
    import warnings

    from torchmetrics.image.inception import InceptionScore

    warnings.filterwarnings("ignore", message=".*will save all extracted features.*")

    metric = InceptionScore(feature=_Logits(net).eval(), splits=splits, normalize=False)  # takes our float [0,1] input as is
    x = to_float(images)
    for s in range(0, len(x), 500):
        metric.update(x[s:s + 500])
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # torchmetrics shuffles before splitting
        mean, std = metric.compute()
    return float(mean), float(std)


def _kth_neighbour_radius(feats: np.ndarray, k: int) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatL2(feats.shape[1])
    index.add(feats)
    dist, _ = index.search(feats, k + 1)  # the first neighbour is the point itself
    return np.sqrt(np.maximum(dist[:, k], 0.0))


def _inside_any_ball(queries: np.ndarray, centres: np.ndarray, radii: np.ndarray) -> np.ndarray:
    d2 = (queries ** 2).sum(1)[:, None] - 2 * queries @ centres.T + (centres ** 2).sum(1)[None]
    return (np.sqrt(np.maximum(d2, 0.0)) <= radii[None] + 1e-6).any(axis=1)


def precision_recall(real_feats: np.ndarray, fake_feats: np.ndarray, k: int = 3) -> tuple[float, float]:
    """Improved precision and recall (k-NN balls, Kynkaanniemi et al. 2019).

    precision: share of fake samples inside the real manifold; recall: share of
    real samples inside the fake manifold.  k-NN radii from faiss.
    """
    real_r = _kth_neighbour_radius(real_feats, k)
    fake_r = _kth_neighbour_radius(fake_feats, k)
    precision = float(_inside_any_ball(fake_feats, real_feats, real_r).mean())
    recall = float(_inside_any_ball(real_feats, fake_feats, fake_r).mean())
    return precision, recall
