"""k-means pseudo-labels with faiss: fit on one split, label every example by its nearest centroid.

A private example's label is a function of that example and of centroids
fitted on public data only, so it adds no privacy cost when the fit split is
public.  Fitting on the private split is recorded in the ledger as a
noise-free use of private records.
"""

from __future__ import annotations

import numpy as np

from ..files.artifacts import open_hdf5
from ..files.atomic import atomic_path, write_json
from ..data.datafile import SPLITS, PreparedData, split_group
from ..errors import DpsadError
from ..data.pseudo_labels import write_pseudo_labels
from ..privacy.books.ledger import make_entry, write_ledger
from ..privacy.books.preparation import check_same_preparation, stamped
from ..privacy.books.public_preparation import stamped_public
from .teacher_features import teacher_features


def fit_kmeans(features: np.ndarray, k: int, *, niter: int, nredo: int, seed: int) -> np.ndarray:
    """Centroids [k, D] of faiss k-means on ``features`` [N, D]."""
    import faiss

    features = np.ascontiguousarray(features, dtype=np.float32)
    if features.ndim != 2 or len(features) == 0:
        raise DpsadError(f"k-means: features of shape {features.shape}, expected a non-empty N x D array")
    if k > len(features):
        raise DpsadError(f"k-means: {k} clusters but only {len(features)} examples to fit on, expected at most {len(features)} clusters")
    kmeans = faiss.Kmeans(features.shape[1], k, niter=niter, nredo=nredo, seed=seed, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=max(256, len(features)))
    kmeans.train(features)
    return kmeans.centroids.copy()


def nearest_centroid(features: np.ndarray, centroids: np.ndarray, rows_at_once: int | None = None) -> np.ndarray:
    """Index of the nearest centroid (l2) for each row [N, D] -> int64 [N]: depends on that row alone.

    Element-wise differences summed along each row in float64, not a matrix product: a BLAS product's rounding
    can depend on the other rows of the call, and a near-tie would then give a record another's label.  Rows go
    in chunks whose [rows, k, D] temporaries stay near 32 MB each, whatever k and D."""
    if len(features) == 0:
        return np.zeros(0, dtype=np.int64)
    if features.shape[1] != centroids.shape[1]:
        raise DpsadError(f"features have {features.shape[1]} dimensions but centroids {centroids.shape[1]}, expected the same")
    centres = np.asarray(centroids, dtype=np.float64)[None]
    rows_at_once = rows_at_once or max(1, 2 ** 22 // centres[0].size)
    labels = [np.square(np.asarray(features[s:s + rows_at_once], dtype=np.float64)[:, None] - centres).sum(axis=2)
              .argmin(axis=1) for s in range(0, len(features), rows_at_once)]
    return np.concatenate(labels).astype(np.int64)


def purity(labels_true: np.ndarray, clusters: np.ndarray) -> float:
    """Share of examples whose cluster's majority true class is their own."""
    total = 0
    for c in np.unique(clusters):
        total += np.bincount(labels_true[clusters == c]).max()
    return float(total / len(labels_true))


def scores(labels_true, clusters) -> dict:
    # here, not at the top: the evaluate stage imports this module for cluster_to_class, and scikit-learn's
    # import costs about a second of every such job
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    return {"nmi": float(normalized_mutual_info_score(labels_true, clusters)),
            "ari": float(adjusted_rand_score(labels_true, clusters)), "purity": purity(labels_true, clusters)}


CURATOR_ONLY = ("Curator only: these scores and cluster sizes are computed on the private split without noise; "
                "they are not covered by any run's guarantee and must not be shared.")


REPORT_NAMES = {"moco": "moco", "pixels": "raw_pixels", "teacher": "teacher_encoder"}  # kmeans.features -> report row


def pixel_features(images: np.ndarray) -> np.ndarray:
    """Raw pixels in [0, 1]: uint8 [N,H,W,C] -> float32 [N, H*W*C]."""
    return images.reshape(len(images), -1).astype(np.float32) / 255.0


def feature_kinds(data: PreparedData, features_path, kinds, teacher_path=None, device="cpu", *,
                  private_alone: bool = True) -> dict:
    """{kind: {split: float32 [N, D]}} for each of ``kinds`` (moco, pixels, teacher).  With ``private_alone``, the
    teacher's features of the private split are computed one record at a time, as labels that feed a training
    need (see :func:`dpsad.moco.train.extract_features`); without it in batches of 500, seven times faster."""
    out = {}
    if "moco" in kinds:
        with open_hdf5(features_path, "features file") as handle:
            check_same_preparation(handle.attrs, data.attrs, features_path)
            out["moco"] = {name: handle[name]["features"][()] for name in SPLITS}
    if "pixels" in kinds:
        out["pixels"] = {name: pixel_features(data.splits[name].images) for name in SPLITS}
    if "teacher" in kinds:
        if teacher_path is None:
            raise DpsadError("kmeans.features = 'teacher' needs kmeans.teacher, expected the name of a public teacher")
        out["teacher"] = {name: teacher_features(data.splits[name].images, teacher_path, device,
                                                 batch=1 if name == "train" and private_alone else 500)
                          for name in SPLITS}
    return out


def _labels_of(feats: dict, settings: dict) -> dict:
    """Fit k-means on the fit split of one feature kind; every split's nearest-centroid labels."""
    centroids = fit_kmeans(feats[split_group(settings["fit_split"])], settings["clusters"], niter=settings["iterations"],
                           nredo=settings["restarts"], seed=settings["seed"])
    return {name: nearest_centroid(feats[name], centroids) for name in SPLITS}


def cluster_labels(data: PreparedData, features_path, settings: dict, out_labels, ledger_path, log, teacher_path=None,
                   device="cpu", upstream_ledgers=()) -> dict:
    """Fit k-means on ``settings['fit_split']`` of the ``settings['features']`` kind; write every split's labels and
    their ledger: ``upstream_ledgers`` (the features' and, for teacher features, the teacher's) and the k-means
    entry.  Returns {split: int64 [N]}.
    """
    chosen = settings["features"]
    feats = feature_kinds(data, features_path, (chosen,), teacher_path, device)[chosen]
    labels = _labels_of(feats, settings)
    entry = make_entry(stage="kmeans_labels", private=settings["fit_split"] == "private", mechanism="none",
                       notes=f"k-means fitted without noise on the {settings['fit_split']} split")
    stamped_public(stamped([entry], data.attrs), data.attrs)
    write_pseudo_labels(out_labels, labels, [f"cluster_{c}" for c in range(settings["clusters"])],
                        fit_split=settings["fit_split"], features=chosen, ledger_entries=[entry], data_attrs=data.attrs)
    write_ledger(ledger_path, [entry], upstream=upstream_ledgers)
    log.info("k-means labels from %s features: private cluster sizes %s", chosen,
             np.bincount(labels["train"], minlength=settings["clusters"]).tolist())
    return labels


def cluster_report(data: PreparedData, features_path, settings: dict, out_report, out_markdown, ledger_path, log,
                   teacher_path=None, device="cpu", upstream_ledgers=()) -> dict:
    """The curator's cluster report (JSON + Markdown): for each feature kind (MoCo, raw pixels, and the encoder of
    ``teacher_path`` when given), k-means fitted as :func:`cluster_labels` fits it, scored against the private
    split's labels where it has them.  Reads private labels without noise: never released, feeds nothing; its
    ledger (``upstream_ledgers`` and its own noise-free entry) says so."""
    chosen = settings["features"]
    k = settings["clusters"]
    kinds = ("moco", "pixels") + (("teacher",) if teacher_path is not None else ())
    # only the chosen kind's private sizes must be those of the labels (which kmeans_labels computes one record at
    # a time); the other kinds' scores feed nothing, so their teacher features are batched
    features = feature_kinds(data, features_path, kinds, teacher_path, device, private_alone=chosen == "teacher")
    true = data.splits["train"].labels if data.labelled else None
    report = {"curator_only": CURATOR_ONLY, "clusters": k, "fit_split": settings["fit_split"], "features": chosen}
    for kind, feats in features.items():
        labels = _labels_of(feats, settings)
        if kind == chosen:
            report["cluster_sizes_private"] = np.bincount(labels["train"], minlength=k).tolist()
        if true is not None:
            report[REPORT_NAMES[kind]] = scores(true, labels["train"])
    write_json(out_report, report)
    lines = ["# Cluster report (curator only)", "", CURATOR_ONLY, "",
             f"k = {k}, fitted on the {settings['fit_split']} split; scores on the private split; "
             f"labels written from the **{REPORT_NAMES[chosen]}** features.", "",
             "| features | NMI | ARI | purity |", "|---|---|---|---|"]
    for name in REPORT_NAMES.values():
        if name in report:
            s = report[name]
            lines.append(f"| {name} | {s['nmi']:.4f} | {s['ari']:.4f} | {s['purity']:.4f} |")
    if true is None:
        lines.append("| (not computed: the dataset has no labels) | | | |")
    if "cluster_sizes_private" in report:
        lines += ["", "Cluster sizes (private split): " + ", ".join(map(str, report["cluster_sizes_private"]))]
    with atomic_path(out_markdown) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    entry = make_entry(stage="cluster_report", private=True, mechanism="none",
                       notes="k-means scored against the private split's labels without noise (curator only, never "
                             "released)")
    write_ledger(ledger_path, stamped([entry], data.attrs), upstream=upstream_ledgers)
    log.info("cluster report: %s", {k_: v for k_, v in report.items() if k_ != "cluster_sizes_private"})
    return report


def cluster_to_class(clusters: np.ndarray, classes: np.ndarray, k: int) -> np.ndarray:
    """For each of ``k`` clusters, the most frequent class among the examples in it -> int64 [k].

    Called with the public split's clusters and labels, the map is public: evaluation uses it to
    read a k-means run's cluster ids as classes.  A cluster with no example takes the most frequent
    class overall.
    """
    if len(classes) == 0:
        raise DpsadError("cluster_to_class: no labelled examples, expected the public split's labels")
    overall = int(np.bincount(classes).argmax())
    out = np.full(k, overall, dtype=np.int64)
    for c in range(k):
        members = classes[clusters == c]
        if len(members):
            out[c] = int(np.bincount(members).argmax())
    return out
