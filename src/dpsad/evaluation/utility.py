"""Downstream utility: logistic regression, an MLP and a CNN trained on one set, tested on the real test split.

Selection of hyperparameters and epochs uses a held-out part of the training
set only (see :func:`train_and_select`); :func:`downstream_accuracy` touches
the test split once per model, after selection.
"""

from __future__ import annotations

import numpy as np
import torch

from .classifiers import MLP, ConvNet, fit_select, holdout_split, to_float

LOGREG_C = (0.01, 0.1, 1.0)


def train_and_select(images: np.ndarray, labels: np.ndarray, num_classes: int, *, epochs: int, lr: float, batch: int,
                     holdout: float, seed: int, cnn_trainings: int = 1) -> dict:
    """Fit the three classifiers on ``images``/``labels`` with selection on a held-out part of them.

    The CNN is trained ``cnn_trainings`` times (seeds seed, seed+1, ...: initialisation
    and batch order) on the same held-out split; its entries are ``cnn`` (the first)
    and ``cnn_<k>`` for the others.  Returns {name: (predict function, selection
    info)}; reads nothing else.
    """
    from sklearn.linear_model import LogisticRegression  # here: train_evaluator imports this module, never fits one

    fit, sel = holdout_split(len(images), holdout, seed)
    x = to_float(images)
    y = torch.from_numpy(labels).long()
    flat = x.flatten(1).numpy()
    models = {}

    best = None
    for c in LOGREG_C:
        clf = LogisticRegression(C=c, max_iter=300)
        clf.fit(flat[fit], labels[fit])
        score = clf.score(flat[sel], labels[sel])
        if best is None or score > best[1]:
            best = (clf, score, c)
    logreg = best[0]
    models["logreg"] = (lambda imgs: logreg.predict(to_float(imgs).flatten(1).numpy()), {"C": best[2], "select_accuracy": best[1]})

    torch.manual_seed(seed)
    mlp = fit_select(MLP(x[0].numel(), num_classes), x[fit], y[fit], x[sel], y[sel], epochs=epochs, lr=lr, batch=batch, seed=seed)
    chosen_models = [("mlp", mlp)]
    for k in range(cnn_trainings):
        torch.manual_seed(seed + k)
        cnn = fit_select(ConvNet(x.shape[1], num_classes, x.shape[-1]), x[fit], y[fit], x[sel], y[sel], epochs=epochs, lr=lr,
                         batch=batch, seed=seed + k)
        chosen_models.append(("cnn" if k == 0 else f"cnn_{k}", cnn))
    for name, chosen in chosen_models:
        model = chosen.model
        models[name] = (lambda imgs, m=model: predict_classes(m, imgs),
                        {"epoch": chosen.epoch, "select_accuracy": chosen.select_accuracy})
    return models


@torch.no_grad()
def predict_classes(model, images: np.ndarray) -> np.ndarray:
    """uint8 images [N,H,W,C] -> the model's argmax class per image, int64 [N] (batches of 512)."""
    x = to_float(images)
    return torch.cat([model(x[s:s + 512]).argmax(1) for s in range(0, len(x), 512)]).numpy()


def downstream_accuracy(train_images, train_labels, test_images, test_labels, num_classes: int, *, epochs: int, lr: float,
                        batch: int, holdout: float, seed: int, cnn_trainings: int = 1) -> tuple[dict, dict]:
    """(accuracy on the test split per classifier, selection details).

    ``cnn`` is the mean test accuracy of ``cnn_trainings`` CNN trainings, ``cnn_std``
    their standard deviation (ddof 1; 0.0 for one training) and ``cnn_runs`` each one.
    """
    models = train_and_select(train_images, train_labels, num_classes, epochs=epochs, lr=lr, batch=batch, holdout=holdout,
                              seed=seed, cnn_trainings=cnn_trainings)
    single = {name: float(np.mean(predict(test_images) == test_labels)) for name, (predict, _) in models.items()}
    cnn_runs = [single.pop("cnn")] + [single.pop(f"cnn_{k}") for k in range(1, cnn_trainings)]
    accuracies = {**single, "cnn": float(np.mean(cnn_runs)),
                  "cnn_std": float(np.std(cnn_runs, ddof=1)) if len(cnn_runs) > 1 else 0.0, "cnn_runs": cnn_runs}
    return accuracies, {name: info for name, (_, info) in models.items()}
