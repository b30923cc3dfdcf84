"""MoCo levers for k-means pseudo-labels: NMI on public data against raw pixels and teacher features.

Each variant trains MoCo on the public split of a prepared dataset (the demo's
results/mnist5k/data.h5), as the pipeline does, extracts features, fits k-means
on one half of the public split and scores the nearest-centroid labels of the
other half against its labels (NMI, ARI, purity).  No private and no test
record is read (``dpsad.evaluation.tuning``), so the chosen default is not a
decision on the private data:

    .venv/bin/python benchmarks/moco_levers.py --data results/mnist5k/data.h5 \
        --teacher results/mnist5k/teacher/public.pt --variants default queue256 ...

``--encoder results/mnist5k/moco/encoder.pt --variants`` (no variant) scores ways of clustering the features of
an encoder already trained: more k-means restarts, features averaged over augmented views, spectral clustering.

``--held-out-fonts`` scores styles MoCo has never seen, a public stand-in for the step from printed to handwritten
digits: the public font digits are rendered again with their fonts, MoCo and k-means see those of two fonts in three,
and NMI is taken on the digits of the other fonts.  It is the criterion for ``label_weight``.  Without it, a MoCo
that learns from labels (``label_weight`` > 0, the demo's) trains on the fitted half of the public split alone, so
that it never learns the scored half's labels; the row says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
import yaml

from dpsad.config import load_schema, validate_against
from dpsad.data.datafile import PreparedData, Split, read_datafile
from dpsad.data.font_glyphs import DIGIT_CLASSES, render_font_digits_with_fonts
from dpsad.data.raw import RawDataset, apply_image_size, validate
from dpsad.evaluation.tuning import public_only
from dpsad.moco.cluster import fit_kmeans, nearest_centroid, pixel_features, scores
from dpsad.moco.teacher_features import teacher_features
from dpsad.moco.augment import view
from dpsad.moco.model import MoCo
from dpsad.moco.train import extract_features, load_encoder, train_moco
from dpsad.utils import images_to_tensor, make_generator

# Overrides of the schema's moco defaults (the first row is the default itself).
VARIANTS = {
    "default": {},
    "epochs_10": {"epochs": 10},
    "epochs_20": {"epochs": 20},
    "epochs_100": {"epochs": 100},
    "epochs_50": {"epochs": 50},
    "epochs_150": {"epochs": 150},
    "temperature_0.1": {"temperature": 0.1},
    "augment_crop": {"augment": "crop"},
    "augment_crop_erase": {"augment": "crop_erase"},
    "augment_handwriting": {"augment": "handwriting"},
    "augment_handwriting_100": {"augment": "handwriting", "epochs": 100},
    "augment_handwriting_backbone": {"augment": "handwriting", "features": "backbone"},
    "augment_handwriting_t01": {"augment": "handwriting", "temperature": 0.1},
    "augment_handwriting_narrow_100": {"augment": "handwriting", "widths": [8, 16, 32], "epochs": 100},
    "backbone_features": {"features": "backbone"},
    "sgd": {"optimizer": "sgd", "lr": 0.06},
    "wide": {"widths": [32, 64, 128]},
    "full_width": {"widths": [16, 32, 64]},
    "full_width_70": {"widths": [16, 32, 64], "epochs": 70},
    "queue_1024": {"queue_size": 1024},
    "lr_0.004": {"lr": 0.004},
    "batch_64": {"batch_size": 64},
    "momentum_0.95": {"momentum": 0.95},
    "feature_dim_128": {"feature_dim": 128},
    "temperature_0.35": {"temperature": 0.35},
    "temperature_0.5": {"temperature": 0.5},
    "queue_128": {"queue_size": 128},
    "pooling_mean": {"pooling": "mean"},
    "pooling_pyramid": {"pooling": "pyramid"},
    "label_weight_0": {"label_weight": 0.0},
    "label_weight_0.25": {"label_weight": 0.25},
    "label_weight_0.5": {"label_weight": 0.5},
    "label_weight_0.75": {"label_weight": 0.75},
    "label_weight_1": {"label_weight": 1.0},
}


def section_defaults(name: str, config_path: str | None = None) -> dict:
    """The schema's defaults of the top-level section ``name``, overlaid with ``config_path``'s when given."""
    schema = load_schema()
    section = yaml.safe_load(Path(config_path).read_text()).get(name, {}) if config_path else {}
    return validate_against(dict(section), schema["properties"][name] | {"$defs": schema["$defs"]}, name)


def moco_defaults(config_path: str | None = None) -> dict:
    """The schema's moco defaults, overlaid with the ``moco`` section of ``config_path`` when given."""
    return section_defaults("moco", config_path)


def deskew(images: np.ndarray) -> np.ndarray:
    """uint8 [N,H,W,1] -> the same with each image sheared so that its intensity has no slant (x-y covariance 0)."""
    from scipy import ndimage

    out = images.copy()
    h, w = images.shape[1:3]
    yy, xx = np.mgrid[:h, :w]
    centre = np.array([(h - 1) / 2, (w - 1) / 2])
    for i, image in enumerate(images[..., 0].astype(np.float64)):
        total = image.sum()
        if total <= 0:
            continue
        cy, cx = (image * yy).sum() / total, (image * xx).sum() / total
        slant = (image * (yy - cy) * (xx - cx)).sum() / (image * (yy - cy) ** 2).sum()
        shear = np.array([[1.0, 0.0], [slant, 1.0]])  # output (y, x) reads input (y, x + slant * y), centred
        moved = ndimage.affine_transform(image, shear, offset=np.array([cy, cx]) - shear @ centre, order=1)
        out[i, ..., 0] = np.clip(np.round(moved), 0, 255).astype(images.dtype)
    return out


def held_out_fonts(prepared: PreparedData, n_per_class: int, seed: int) -> PreparedData:
    """Font digits as the pipeline renders them, split by font: ``public`` and ``train`` hold the digits of two fonts
    in three, ``test`` those of the others (fonts 2, 5, 8, ...), at ``prepared``'s image size."""
    images, labels, fonts = render_font_digits_with_fonts(n_per_class, seed)
    raw = apply_image_size(validate(RawDataset(images=images, labels=labels, class_names=list(DIGIT_CLASSES), notes={}),
                                    "font_digits"), prepared.image_size)
    seen = fonts % 3 != 2
    fit, held = Split(raw.images[seen], labels[seen]), Split(raw.images[~seen], labels[~seen])
    return PreparedData(splits={"train": fit, "public": fit, "test": held}, class_names=DIGIT_CLASSES, labelled=True,
                        image_size=prepared.image_size, channels=1, attrs={})


def kmeans_scores(fit: np.ndarray, held: np.ndarray, labels: np.ndarray, k: int) -> dict:
    """k-means fitted on features ``fit``; the nearest-centroid labels of ``held`` scored against ``labels``."""
    centroids = fit_kmeans(fit, k, niter=50, nredo=5, seed=0)
    return scores(labels, nearest_centroid(held, centroids))


@torch.no_grad()
def encoder_features(model: MoCo, images: np.ndarray, recipe: str | None = None, views: int = 1) -> np.ndarray:
    """L2-normalised head features [N, D], averaged over ``views`` augmented views when ``recipe`` is given."""
    x, gen = images_to_tensor(images), make_generator(0)
    total = sum(torch.nn.functional.normalize(model.query(view(x, gen, recipe) if recipe else x), dim=1)
                for _ in range(views if recipe else 1))
    return torch.nn.functional.normalize(total, dim=1).numpy()


def clustering_rows(encoder_path: str, fit, held, k: int, row) -> None:
    """Ways of clustering a trained encoder's features, each fitted on ``fit`` and scored on ``held``."""
    from sklearn.cluster import SpectralClustering
    from sklearn.neighbors import KNeighborsClassifier

    model = load_encoder(encoder_path, "cpu")
    a, b = encoder_features(model, fit.images), encoder_features(model, held.images)
    row("encoder: k-means, 5 restarts (the pipeline's setting)", 0, kmeans_scores(a, b, held.labels, k))
    centroids = fit_kmeans(a, k, niter=50, nredo=20, seed=0)
    row("encoder: k-means, 20 restarts", 0, scores(held.labels, nearest_centroid(b, centroids)))
    for recipe in ("crop", "affine", "handwriting"):
        for views in (8, 32):
            start = time.perf_counter()
            fa, fb = (encoder_features(model, s.images, recipe, views) for s in (fit, held))
            row(f"encoder: features averaged over {views} {recipe} views", time.perf_counter() - start,
                kmeans_scores(fa, fb, held.labels, k))
    for neighbours in (20, 40):  # spectral labels of the fit half, carried to the held half by a 10-NN vote
        fitted = SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=neighbours, random_state=0,
                                    assign_labels="cluster_qr").fit(a)
        vote = KNeighborsClassifier(10).fit(a, fitted.labels_)
        row(f"encoder: spectral clustering, {neighbours} neighbours", 0, scores(held.labels, vote.predict(b)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="results/mnist5k/data.h5")
    parser.add_argument("--teacher", help="a teacher trained on the public split (its encoder features are scored)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--config", help="take the moco defaults from this configuration file (e.g. config/config.yaml)")
    parser.add_argument("--seeds", type=int, default=1, help="MoCo trainings per variant (seeds 0, 1, ...): mean +- std")
    parser.add_argument("--encoder", help="a trained MoCo encoder (results/<dataset>/moco/encoder.pt): score ways of "
                                          "clustering its features")
    parser.add_argument("--deskew", action="store_true", help="deskew every public digit first (MoCo and k-means)")
    parser.add_argument("--held-out-fonts", action="store_true",
                        help="score on font digits of fonts MoCo never saw (renders them again: --font-digits images "
                             "per class, --render-seed)")
    parser.add_argument("--font-digits", type=int, default=200, help="with --held-out-fonts: images per class")
    parser.add_argument("--render-seed", type=int, default=0, help="with --held-out-fonts: the render's seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    log = logging.getLogger("moco_levers")
    prepared = read_datafile(args.data)
    if args.deskew:
        public = prepared.splits["public"]
        prepared.splits["public"] = Split(deskew(public.images), public.labels)
    if args.held_out_fonts:
        data = held_out_fonts(prepared, args.font_digits, args.render_seed)
        fit, held = data.splits["train"], data.splits["test"]
        print(f"{len(fit)} font digits of two fonts in three (MoCo, k-means fit); scored on the {len(held)} of the "
              f"other fonts")
    else:
        data = public_only(prepared)  # train: half of the public split, test: the other half
        fit, held = data.splits["train"], data.splits["test"]
        print(f"{len(data.splits['public'])} public images (MoCo); k-means (k = {args.clusters}) fitted on {len(fit)} "
              f"of them, scored on the other {len(held)}")
    print("| features | seconds | NMI | ARI | purity |\n|---|---|---|---|---|")

    def row(name, seconds, s):
        print(f"| {name} | {seconds:.0f} | {s['nmi']:.3f} | {s['ari']:.3f} | {s['purity']:.3f} |", flush=True)

    def spread_row(name, seconds, runs):
        cell = {key: f"{np.mean([r[key] for r in runs]):.3f} +- {np.std([r[key] for r in runs], ddof=1):.3f}"
                for key in ("nmi", "ari", "purity")}
        each = ", ".join(f"{r['nmi']:.3f}" for r in runs)
        print(f"| {name} ({len(runs)} seeds, NMI {each}) | {seconds:.0f} | "
              f"{cell['nmi']} | {cell['ari']} | {cell['purity']} |", flush=True)

    row("raw pixels", 0, kmeans_scores(pixel_features(fit.images), pixel_features(held.images), held.labels,
                                       args.clusters))
    if args.teacher:
        for timestep in (10, 50, 150):
            start = time.perf_counter()
            a, b = (teacher_features(s.images, args.teacher, "cpu", timestep=timestep) for s in (fit, held))
            row(f"teacher encoder, t = {timestep}", time.perf_counter() - start,
                kmeans_scores(a, b, held.labels, args.clusters))
    if args.encoder:
        clustering_rows(args.encoder, fit, held, args.clusters, row)
    # MoCo that learns from labels must not see the scored half's: it then trains on the fitted half alone
    fit_only = dataclasses.replace(data, splits={**data.splits, "public": fit})
    for name in args.variants:
        runs, seconds = [], 0.0
        for seed in range(args.seeds):
            settings = {**moco_defaults(args.config), **VARIANTS[name]}
            settings["seed"] = settings.get("seed", 0) + seed
            view = fit_only if settings["label_weight"] > 0 else data
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                start = time.perf_counter()
                train_moco(view, settings, "cpu", tmp / "enc.pt", tmp / "enc.json", tmp / "loss.csv", log)
                extract_features(data, tmp / "enc.pt", "cpu", tmp / "features.h5", which=settings["features"])
                seconds = time.perf_counter() - start
                with h5py.File(tmp / "features.h5") as handle:  # the view's train and test: the public halves
                    a, b = handle["train"]["features"][()], handle["test"]["features"][()]
            runs.append(kmeans_scores(a, b, held.labels, args.clusters))
        label = f"MoCo {name}: {yaml.safe_dump(VARIANTS[name], default_flow_style=True).strip()}"
        if settings["label_weight"] > 0 and not args.held_out_fonts:
            label += f" (with labels: MoCo on the {len(fit)} fitted images only)"
        if len(runs) == 1:
            row(label, seconds, runs[0])
        else:
            spread_row(label, seconds, runs)


if __name__ == "__main__":
    main()
