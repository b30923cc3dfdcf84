"""Memorisation audit in pixel space (faiss exact L2 search).

* closer_to_train_share: share of synthetic samples whose nearest private
  training image is nearer than their nearest test image, with the training
  reference subsampled to the test split's size (so 0.5 means no preference);
* near_copies: synthetic samples whose nearest/second-nearest training
  distance ratio d1/d2 is below 1/3 (a near-duplicate of one training image);
* mia_auc: AUC of the attack that calls a real image a member when it lies
  close to the synthetic set (training members against test non-members,
  equal numbers); 0.5 is chance.
"""

from __future__ import annotations

import numpy as np


def roc_auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """Area under the ROC curve of scores [P] against [N]: P(score+ > score-) + P(tie) / 2 (scikit-learn's)."""
    from sklearn.metrics import roc_auc_score  # here, not at the top: the module is imported by stages that never score

    truth = np.r_[np.ones(len(positive)), np.zeros(len(negative))]
    return float(roc_auc_score(truth, np.concatenate([positive, negative])))


def _flat(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.reshape(len(images), -1).astype(np.float32) / 255.0)


def _search(reference: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatL2(reference.shape[1])
    index.add(reference)
    dist, _ = index.search(queries, k)
    return np.sqrt(np.maximum(dist, 0.0))


def audit(synthetic: np.ndarray, train: np.ndarray, test: np.ndarray, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    syn, tr, te = _flat(synthetic), _flat(train), _flat(test)
    m = min(len(tr), len(te))
    tr_sub = tr[rng.choice(len(tr), m, replace=False)]
    te_sub = te[rng.choice(len(te), m, replace=False)]
    d_train = _search(tr_sub, syn, 1)[:, 0]
    d_test = _search(te_sub, syn, 1)[:, 0]
    two = _search(tr, syn, 2)
    ratio = two[:, 0] / np.maximum(two[:, 1], 1e-12)
    member_scores = -_search(syn, tr_sub, 1)[:, 0]
    nonmember_scores = -_search(syn, te_sub, 1)[:, 0]
    auc = roc_auc(member_scores, nonmember_scores)
    return {
        "closer_to_train_share": float(np.mean(d_train < d_test)),
        "near_copies": int(np.sum(ratio < 1.0 / 3.0)),
        "mia_auc": float(auc),
        "median_nn_distance_train": float(np.median(two[:, 0])),
    }
