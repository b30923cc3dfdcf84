"""The evaluate stage's orchestration: evaluator training and metrics.json (the table: :mod:`.table`)."""

from __future__ import annotations

import json

import numpy as np
import torch

from ..files.artifacts import load_torch, save_torch
from ..files.atomic import write_json
from ..data.datafile import PreparedData
from ..errors import DpsadError
from ..synthetic import SyntheticData
from .classifiers import ConvNet, fit_select, holdout_split, to_float
from .fidelity import features, fid, inception_score, precision_recall
from .memorization import audit
from .table import SCOPE
from .utility import downstream_accuracy


def not_computed(reason: str) -> str:
    return f"not computed: {reason}"


def train_evaluator(data: PreparedData, settings: dict, out_path, log) -> dict:
    """A ConvNet on the real private split (selection on a held-out tenth of it); saved with its accuracies."""
    train, test = data.splits["train"], data.splits["test"]
    if not data.labelled or train.labels is None:
        raise DpsadError("the evaluator needs labels: this dataset is unlabelled, expected a labelled dataset")
    torch.manual_seed(settings["seed"])
    fit, sel = holdout_split(len(train), settings["holdout_fraction"], settings["seed"])
    x, y = to_float(train.images), torch.from_numpy(train.labels)
    net = ConvNet(x.shape[1], data.num_classes, x.shape[-1])
    chosen = fit_select(net, x[fit], y[fit], x[sel], y[sel], epochs=settings["evaluator_epochs"], lr=settings["lr"],
                        batch=settings["batch_size"], seed=settings["seed"])
    test_acc = float((chosen.model(to_float(test.images)).argmax(1).numpy() == test.labels).mean())
    log.info("evaluator: epoch %d, held-out accuracy %.4f, test accuracy %.4f", chosen.epoch, chosen.select_accuracy, test_acc)
    state = {"model": chosen.model.state_dict(), "in_channels": x.shape[1], "num_classes": data.num_classes,
             "image_size": x.shape[-1], "test_accuracy": test_acc, "select_accuracy": chosen.select_accuracy,
             "epoch": chosen.epoch}
    save_torch(state, out_path)
    return state


def load_evaluator(path) -> ConvNet:
    state = load_torch(path, map_location="cpu")
    net = ConvNet(state["in_channels"], state["num_classes"], state["image_size"])
    net.load_state_dict(state["model"])
    return net.eval()


def check_compatible(synthetic: SyntheticData, data: PreparedData, classes: bool = True) -> None:
    """Refuse a synthetic set whose image size, channels or (with ``classes``) classes differ from the real test
    split; a k-means run's clusters are compared once read as classes (:func:`read_clusters_as_classes`)."""
    test = data.splits["test"]
    if synthetic.images.shape[1:] != test.images.shape[1:]:
        raise DpsadError(f"synthetic images are {synthetic.images.shape[1:]}, expected {test.images.shape[1:]} like the test split")
    if classes and synthetic.labels is not None and synthetic.class_names != data.class_names:
        raise DpsadError(f"synthetic class names {synthetic.class_names}, expected {data.class_names} like the test split")


def read_clusters_as_classes(synthetic: SyntheticData, data: PreparedData, pseudo_labels_path) -> tuple[SyntheticData, list[int]]:
    """A k-means run's synthetic data with each cluster id replaced by the public split's majority class
    of that cluster (a map computed from public data only), and the map [k].

    Every metric of the run is then read against the real classes like the other runs'; its
    ``class_fidelity`` is the share of samples the evaluator assigns to their cluster's majority class.
    """
    from ..data.pseudo_labels import read_pseudo_labels
    from ..moco.cluster import cluster_to_class

    public = data.splits["public"]
    if not data.labelled or public.labels is None:
        raise DpsadError("a k-means run is scored against real classes: the public split has no labels, expected a "
                         "labelled dataset for the evaluate stage")
    clusters, names = read_pseudo_labels(pseudo_labels_path, data.attrs)
    if synthetic.labels is None or synthetic.class_names != names:
        raise DpsadError(f"synthetic classes {synthetic.class_names}, expected the k-means clusters {names}")
    mapping = cluster_to_class(clusters["public"], public.labels, len(names))
    attrs = {**synthetic.attrs, "class_names": json.dumps(data.class_names)}
    return SyntheticData(images=synthetic.images, labels=mapping[synthetic.labels], attrs=attrs), mapping.tolist()


def _fidelity(net, real: np.ndarray, fake: np.ndarray, settings: dict) -> dict:
    out = {}
    out["fid_evaluator"] = fid(net, real, fake)
    mean, std = inception_score(net, fake, seed=settings["seed"])
    out["is_evaluator"], out["is_evaluator_std"] = mean, std
    out["precision"], out["recall"] = precision_recall(features(net, real), features(net, fake), k=settings["knn_k"])
    return out


def evaluate_synthetic(synthetic: SyntheticData, data: PreparedData, net, settings: dict, privacy: dict, log) -> dict:
    """metrics.json for one run (see the keys in the README)."""
    check_compatible(synthetic, data)
    test, train = data.splits["test"], data.splits["train"]
    metrics = {"run": synthetic.attrs["run"], "method": synthetic.attrs["method"], "n_samples": int(len(synthetic.images))}
    metrics.update(_fidelity(net, test.images, synthetic.images, settings))
    if synthetic.labels is None:
        metrics["accuracy"] = {k: not_computed("unconditional run: the synthetic data has no labels") for k in ("logreg", "mlp", "cnn")}
    else:
        acc, selection = _classifier_accuracy(synthetic.images, synthetic.labels, data, settings)
        metrics["accuracy"], metrics["model_selection"] = acc, selection
        metrics["evaluator_accuracy_on_synthetic"] = float(
            (net(to_float(synthetic.images)).argmax(1).numpy() == synthetic.labels).mean())
    metrics["memorization"] = audit(synthetic.images, train.images, test.images, seed=settings["seed"])
    for key in ("epsilon", "delta", "dp_guarantee", "target_epsilon", "accountant"):
        metrics[key] = privacy.get(key)
    metrics["scope"] = SCOPE
    log.info("metrics: %s", json.dumps({k: v for k, v in metrics.items() if k != "scope"}, default=str))
    return metrics


def _classifier_accuracy(images, labels, data: PreparedData, settings: dict) -> tuple[dict, dict]:
    """The utility classifiers trained on ``images`` [N,H,W,C] uint8 with ``labels`` [N], tested on the real test split."""
    test = data.splits["test"]
    return downstream_accuracy(images, labels, test.images, test.labels, data.num_classes,
                               epochs=settings["classifier_epochs"], lr=settings["lr"],
                               batch=settings["classifier_batch_size"], holdout=settings["holdout_fraction"],
                               seed=settings["seed"], cnn_trainings=settings["cnn_trainings"])


def evaluate_real(data: PreparedData, net, settings: dict, log) -> dict:
    """The ``real`` reference row: the same classifiers trained on the real private split."""
    train, test = data.splits["train"], data.splits["test"]
    rng = np.random.default_rng(settings["seed"])
    metrics = {"run": "real", "method": "real", "n_samples": int(len(train))}
    subset = train.images[rng.choice(len(train), min(len(train), len(test)), replace=False)]
    metrics.update(_fidelity(net, test.images, subset, settings))
    acc, selection = _classifier_accuracy(train.images, train.labels, data, settings)
    metrics["accuracy"], metrics["model_selection"] = acc, selection
    metrics["memorization"] = {k: not_computed("the real row is the private data itself")
                               for k in ("closer_to_train_share", "near_copies", "mia_auc")}
    metrics.update({"epsilon": None, "delta": None, "dp_guarantee": False, "target_epsilon": None, "accountant": None})
    metrics["scope"] = SCOPE
    log.info("real row: %s", acc)
    return metrics


def write_metrics(path, metrics: dict) -> None:
    write_json(path, metrics)
