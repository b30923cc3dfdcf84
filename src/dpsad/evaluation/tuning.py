"""Scores for choosing defaults, computed on the public split only.

A default chosen by a score on the private split (or on the final test split)
is a data-dependent decision outside every guarantee (Papernot and Steinke,
"Hyperparameter tuning with Renyi DP").  Scoring here avoids that: the public
split is cut in two halves by a fixed seed, models are fitted on one (``fit``)
and scored on the other (``held``).  No private record and no test record is
read.  The demo's defaults were not all chosen this way: docs/defaults.md marks
those scored on the test split or by the evaluator trained on the private split
(curator-only, declared in the demo's ``earlier_use``).

The generators scored (the public teacher) were trained on the whole public
split, so ``held`` is not unseen by them: the scores rank settings against
each other, they are not utility figures.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..data.datafile import PreparedData, Split
from .evaluate_stage import load_evaluator, train_evaluator
from .utility import downstream_accuracy, predict_classes


def public_halves(data: PreparedData, seed: int = 0) -> tuple[Split, Split]:
    """The public split cut into (fit, held) halves by a seeded permutation."""
    public = data.splits["public"]
    order = np.random.default_rng(seed).permutation(len(public))
    cut = len(public) // 2

    def part(idx):
        return Split(public.images[idx], None if public.labels is None else public.labels[idx])

    return part(order[:cut]), part(order[cut:])


def public_only(data: PreparedData, seed: int = 0) -> PreparedData:
    """``data`` with the public halves as its ``train`` and ``test`` splits and nothing else."""
    fit, held = public_halves(data, seed)
    return PreparedData(splits={"train": fit, "public": data.splits["public"], "test": held},
                        class_names=data.class_names, labelled=data.labelled, image_size=data.image_size,
                        channels=data.channels, attrs=dict(data.attrs))


class PublicScorer:
    """Scores samples against the public split: an evaluator fitted on ``fit``, classifiers tested on ``held``."""

    def __init__(self, data: PreparedData, settings: dict, log, seed: int = 0, evaluator_path=None):
        self.view = public_only(data, seed)
        self.settings = settings
        with tempfile.TemporaryDirectory() as tmp:
            path = evaluator_path or Path(tmp) / "public_evaluator.pt"
            train_evaluator(self.view, settings, path, log)
            self.evaluator = load_evaluator(path)

    def __call__(self, images: np.ndarray, labels: np.ndarray) -> dict:
        held = self.view.splits["test"]
        s = self.settings
        acc, _ = downstream_accuracy(images, labels, held.images, held.labels, len(self.view.class_names),
                                     epochs=s["classifier_epochs"], lr=s["lr"], batch=s["classifier_batch_size"],
                                     holdout=s["holdout_fraction"], seed=s["seed"], cnn_trainings=s.get("cnn_trainings", 1))
        return {"class_fidelity_public": float((predict_classes(self.evaluator, images) == labels).mean()),
                **{f"acc_{k}_public": acc[k] for k in ("logreg", "mlp", "cnn")}}
