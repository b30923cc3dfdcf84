"""Fidelity in the evaluator's feature and class space: FID, Inception Score, precision and recall.

FID and IS are computed here with the evaluator as the feature extractor and classifier (named
``fid_evaluator`` / ``is_evaluator``: they are *not* Inception-v3 figures and are comparable only within one
dataset).  The formulas are the usual ones (Heusel et al. 2017; Salimans et al. 2016), in float64; no metrics
library is imported, which kept several seconds of imports out of every evaluation job.
"""

from __future__ import annotations

import numpy as np
import torch

from .classifiers import to_float


@torch.no_grad()
def features(net, images: np.ndarray, batch: int = 500) -> np.ndarray:
    """The evaluator's penultimate features: uint8 [N,H,W,C] -> float32 [N, F]."""
    x = to_float(images)
    return torch.cat([net.features(x[s:s + batch]) for s in range(0, len(x), batch)]).numpy().astype(np.float32)


def frechet_distance(mean_a: np.ndarray, cov_a: np.ndarray, mean_b: np.ndarray, cov_b: np.ndarray) -> float:
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)) between two Gaussians ([F] means, [F, F] covariances).

    Tr((S_a S_b)^(1/2)) is the sum of the square roots of the eigenvalues of S_a^(1/2) S_b S_a^(1/2), a symmetric
    positive semi-definite matrix, so only symmetric eigendecompositions are needed (no complex sqrtm).
    """
    values, vectors = np.linalg.eigh(cov_a)
    root_a = (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T
    middle = root_a @ cov_b @ root_a
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0.0, None)).sum()
    diff = mean_a - mean_b
    return float(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * cross)


def _gaussian(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    feats = feats.astype(np.float64)
    return feats.mean(axis=0), np.atleast_2d(np.cov(feats, rowvar=False))


def fid(net, real: np.ndarray, fake: np.ndarray) -> float:
    """FID between two uint8 image sets [N,H,W,C] in the evaluator's feature space."""
    return frechet_distance(*_gaussian(features(net, real)), *_gaussian(features(net, fake)))


@torch.no_grad()
def inception_score(net, images: np.ndarray, splits: int = 10, seed: int = 0) -> tuple[float, float]:
    """(mean, std) over ``splits`` parts of exp(E_x KL(p(y|x) || p(y))), p(y|x) the evaluator's softmax.

    The images are shuffled by ``torch.randperm`` under ``seed`` and cut by ``torch.chunk``, as torchmetrics'
    InceptionScore did here before, so the figures of earlier runs stay comparable.
    """
    x = to_float(images)
    logits = torch.cat([net(x[s:s + 500]) for s in range(0, len(x), 500)])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        logits = logits[torch.randperm(len(logits))]
    scores = []
    for part, log_part in zip(logits.softmax(dim=1).chunk(splits), logits.log_softmax(dim=1).chunk(splits)):
        marginal = part.mean(dim=0, keepdim=True)
        scores.append((part * (log_part - marginal.log())).sum(dim=1).mean().exp())
    scores = torch.stack(scores).double()
    return float(scores.mean()), float(scores.std()) if len(scores) > 1 else 0.0


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
