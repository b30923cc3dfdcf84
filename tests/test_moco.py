"""MoCo and k-means pseudo-labels: hand-checked pieces and the DAG wiring of the labels switch."""

from __future__ import annotations

import logging
import math

import h5py
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from dpsad.errors import DpsadError
from dpsad.moco.augment import elastic, stroke_width, two_views
from dpsad.data.image_tensors import images_to_tensor
from dpsad.moco.cluster import fit_kmeans, nearest_centroid, purity, scores
from dpsad.moco.model import MoCo, info_nce


def tiny_moco(**kw):
    torch.manual_seed(0)
    return MoCo(1, feature_dim=4, queue_size=6, widths=(8, 8, 8), **kw)


def test_momentum_update_moves_the_key_encoder_towards_the_query():
    model = tiny_moco(momentum=0.9)
    with torch.no_grad():
        for p in model.query.parameters():
            p.add_(1.0)
    before = [k.clone() for k in model.key.parameters()]
    query = [q.clone() for q in model.query.parameters()]
    model.momentum_update()
    for k_old, q, k_new in zip(before, query, model.key.parameters()):
        assert torch.allclose(k_new, 0.9 * k_old + 0.1 * q, atol=1e-6)
    assert all(not p.requires_grad for p in model.key.parameters())


def test_queue_is_first_in_first_out_and_wraps():
    model = tiny_moco()
    a, b, c = torch.full((4, 4), 1.0), torch.full((4, 4), 2.0), torch.full((2, 4), 3.0)
    model.enqueue(a)
    assert model.queue[:4].eq(1).all() and int(model.queue_ptr) == 4
    model.enqueue(b)  # two fit, two wrap around over the oldest entries
    assert model.queue[4:].eq(2).all() and model.queue[:2].eq(2).all() and model.queue[2:4].eq(1).all()
    assert int(model.queue_ptr) == 2
    model.enqueue(c)
    assert model.queue[2:4].eq(3).all()


def test_info_nce_on_a_hand_checked_case():
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[1.0, 0.0]])
    negatives = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    t = 0.5
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + math.exp(0 / t) + math.exp(-1 / t)))
    assert info_nce(q, k, negatives, t).item() == pytest.approx(expected, rel=1e-6)


def test_forward_returns_one_loss_per_example_and_fills_the_queue():
    model = tiny_moco()
    x = torch.rand(3, 1, 12, 12) * 2 - 1
    gen = torch.Generator().manual_seed(0)
    v1, v2 = two_views(x, gen)
    assert v1.shape == x.shape and not torch.allclose(v1, v2) and v1.min() >= -1 and v1.max() <= 1
    loss = model(v1, v2)
    assert loss.shape == (3,) and int(model.queue_ptr) == 3


def test_nearest_centroid_assignment():
    centroids = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=np.float32)
    points = np.array([[1.0, 1.0], [9.0, -1.0], [-1.0, 8.0], [6.0, 0.0]], dtype=np.float32)
    assert nearest_centroid(points, centroids).tolist() == [0, 1, 2, 1]
    # one example's label depends on that example alone
    assert nearest_centroid(points[3:], centroids).tolist() == [1]
    rng = np.random.default_rng(1)
    many, centres = rng.normal(size=(3000, 64)).astype(np.float32), rng.normal(size=(16, 64)).astype(np.float32)
    together = nearest_centroid(many, centres, rows_at_once=1000)
    assert [int(nearest_centroid(many[i:i + 1], centres)[0]) for i in range(0, 3000, 97)] == together[::97].tolist()
    exact = np.square(many.astype(np.float64)[:, None] - centres.astype(np.float64)[None]).sum(axis=2).argmin(axis=1)
    assert together.tolist() == exact.tolist()


def test_kmeans_recovers_separated_clusters_and_scores():
    rng = np.random.default_rng(0)
    centres = np.array([[0, 0], [20, 0], [0, 20]], dtype=np.float32)
    truth = np.repeat(np.arange(3), 50)
    feats = (centres[truth] + rng.normal(size=(150, 2))).astype(np.float32)
    clusters = nearest_centroid(feats, fit_kmeans(feats, 3, niter=20, nredo=2, seed=0))
    s = scores(truth, clusters)
    assert s["nmi"] == pytest.approx(1.0) and s["ari"] == pytest.approx(1.0) and s["purity"] == 1.0
    assert purity(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0])) == 0.5


def test_kmeans_bad_input():
    with pytest.raises(DpsadError, match="5 clusters but only 3 examples"):
        fit_kmeans(np.zeros((3, 2), np.float32), 5, niter=5, nredo=1, seed=0)
    with pytest.raises(DpsadError, match="non-empty"):
        fit_kmeans(np.zeros((0, 2), np.float32), 2, niter=5, nredo=1, seed=0)
    with pytest.raises(DpsadError, match="dimensions"):
        nearest_centroid(np.zeros((3, 2), np.float32), np.zeros((2, 5), np.float32))


def test_the_projection_head_keeps_features_of_different_images_apart_at_initialisation():
    """Without BatchNorm in the head the GroupNorm encoder maps every digit to nearly the same vector
    (mean cosine 0.997 measured), and InfoNCE then barely learns."""
    torch.manual_seed(0)
    model = MoCo(1, feature_dim=16, queue_size=8, widths=(16, 16, 16))
    x = torch.rand(32, 1, 12, 12) * 2 - 1
    q = torch.nn.functional.normalize(model.query(x), dim=1)
    off_diagonal = (q @ q.t())[~torch.eye(32, dtype=torch.bool)]
    assert off_diagonal.mean().item() < 0.5


def test_shuffled_keys_come_back_in_the_batch_order():
    model = tiny_moco().eval()  # running BatchNorm statistics: grouping cannot change a key
    x = torch.rand(10, 1, 12, 12) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(model.shuffled_keys(x), model.key(x), atol=1e-6)


@pytest.mark.parametrize("recipe", ["crop", "crop_erase", "affine", "v2", "handwriting"])
def test_every_view_recipe_keeps_shape_and_range(recipe):
    x = torch.rand(5, 1, 12, 12) * 2 - 1
    gen = torch.Generator().manual_seed(0)
    v1, v2 = two_views(x, gen, recipe)
    assert v1.shape == x.shape and v1.min() >= -1 and v1.max() <= 1 and not torch.allclose(v1, v2)
    with pytest.raises(ValueError, match="augment = 'colour', expected one of"):
        two_views(x, gen, "colour")


def test_stroke_width_thickens_thins_or_keeps_each_digit():
    x = -torch.ones(30, 1, 8, 8)
    x[:, :, 3:5, 2:6] = 1.0  # a bright bar on black
    out = stroke_width(x, torch.Generator().manual_seed(0))
    change = (out - x).mean(dim=(1, 2, 3))
    assert out.shape == x.shape and out.min() >= -1 and out.max() <= 1
    assert (change > 0).any() and (change < 0).any() and (change == 0).any()  # thicker, thinner, unchanged


def test_the_elastic_warp_moves_strokes_and_is_the_identity_at_zero_strength():
    x = torch.rand(4, 1, 12, 12) * 2 - 1
    assert torch.allclose(elastic(x, torch.Generator().manual_seed(0), strength=0.0), x, atol=1e-5)
    warped = elastic(x, torch.Generator().manual_seed(0))
    assert warped.shape == x.shape and not torch.allclose(warped, x, atol=1e-2) and warped.min() >= -1 - 1e-6


def test_clusters_are_read_as_the_majority_public_class():
    from dpsad.moco.cluster import cluster_to_class

    clusters = np.array([0, 0, 0, 1, 1, 2])
    classes = np.array([3, 3, 1, 2, 2, 1])
    # cluster 3 holds no public example: it takes the most frequent class overall (3 and 1 tie at 2: the smaller, 1)
    assert cluster_to_class(clusters, classes, 4).tolist() == [3, 2, 1, 1]
    with pytest.raises(DpsadError, match="no labelled examples"):
        cluster_to_class(np.zeros(0, np.int64), np.zeros(0, np.int64), 2)


def tiny_moco_settings(**overrides) -> dict:
    """A complete ``moco`` section for one epoch on ``tiny_data``, with ``overrides``."""
    return {"split": "public", "epochs": 1, "batch_size": 4, "queue_size": 4, "momentum": 0.99, "temperature": 0.2,
            "feature_dim": 8, "lr": 0.002, "optimizer": "adamw", "features": "head", "widths": [8, 8, 8],
            "augment": "v2", "pooling": "mean", "label_weight": 0.0, "seed": 0, **overrides}


@pytest.mark.parametrize(("split", "private"), [("public", False), ("private", True)])
def test_moco_on_the_private_split_is_a_noise_free_private_use_in_its_ledger(tmp_path, log, split, private):
    from helpers import tiny_data

    from dpsad.moco.train import extract_features, train_moco
    from dpsad.files.artifacts import load_torch
    from dpsad.job_spending import embedded_entries
    from dpsad.privacy.books.ledger import read_ledgers, verdict

    settings = tiny_moco_settings(split=split)
    data = tiny_data()
    train_moco(data, settings, "cpu", tmp_path / "enc.pt", tmp_path / "enc.json", tmp_path / "loss.csv", log)
    entries = read_ledgers([tmp_path / "enc.json"])
    assert [(e["stage"], e["private"]) for e in entries] == [("train_moco", private)]
    result = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=None, num_private_records=24)
    assert result["dp_guarantee"] is (not private)
    extract_features(data, tmp_path / "enc.pt", "cpu", tmp_path / "features.h5", ledger_entries=entries)
    assert embedded_entries(tmp_path / "features.h5") == entries == load_torch(tmp_path / "enc.pt")["ledger"]
    with h5py.File(tmp_path / "features.h5") as handle:
        feats = handle["train"]["features"][()]
    assert feats.shape == (24, 8) and np.allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)


def test_each_private_records_features_and_label_come_from_that_record_alone(tmp_path, monkeypatch):
    """An encoder whose output leans on its batch-mates (as a batched convolution's rounding may) must not reach a
    private record's features: the private split goes through it one record at a time; the public split may be
    batched.  The teacher's features of the private split too (batch 1), and the labels row by row."""
    from helpers import tiny_data

    from dpsad.moco import cluster
    from dpsad.moco import train as moco_train

    class LeansOnBatchMates(torch.nn.Module):
        def forward(self, x):
            own = x.flatten(1)[:, :8]
            return own + 5 * own.mean(dim=0, keepdim=True)

    model = torch.nn.Module()
    model.query = torch.nn.Sequential(LeansOnBatchMates(), torch.nn.Identity())
    model.query[-1].out_features = 8  # the width extract_features reads off the head
    monkeypatch.setattr(moco_train, "load_encoder", lambda path, device: model)
    data = tiny_data()
    moco_train.extract_features(data, "unused.pt", "cpu", tmp_path / "features.h5", ledger_entries=[])
    with h5py.File(tmp_path / "features.h5") as handle:
        private, public = handle["train"]["features"][()], handle["public"]["features"][()]
    alone = torch.nn.functional.normalize(images_to_tensor(data.splits["train"].images).flatten(1)[:, :8], dim=1)
    np.testing.assert_allclose(private, alone.numpy(), atol=1e-6)  # 6 x its own pixels, normalised
    batched = torch.nn.functional.normalize(model.query(images_to_tensor(data.splits["public"].images)), dim=1)
    np.testing.assert_allclose(public, batched.numpy(), atol=1e-6)

    batches = {}
    monkeypatch.setattr(cluster, "teacher_features",
                        lambda images, path, device, batch=500: batches.setdefault(len(images), batch) and
                        np.zeros((len(images), 4), np.float32))
    cluster.feature_kinds(data, None, ("teacher",), teacher_path="teacher.pt")
    assert batches == {24: 1, 12: 500, 6: 500}  # train, public, test
    # the curator's report, which feeds nothing: the private split one record at a time only where the teacher's
    # features are the labels' own (its cluster sizes are then the labels'), else batched
    with h5py.File(tmp_path / "moco.h5", "w") as handle:
        for name in ("train", "public", "test"):
            count = len(data.splits[name].images)
            handle.create_dataset(f"{name}/features", data=np.eye(8, dtype=np.float32)[np.arange(count) % 8])
    for chosen, private_batch in (("teacher", 1), ("moco", 500)):
        batches.clear()
        settings = {"features": chosen, "clusters": 2, "fit_split": "public", "iterations": 2, "restarts": 1, "seed": 0}
        cluster.cluster_report(data, tmp_path / "moco.h5", settings, tmp_path / "report.json", tmp_path / "report.md",
                               tmp_path / "report.ledger.json", logging.getLogger("test"), teacher_path="teacher.pt")
        assert batches == {24: private_batch, 12: 500, 6: 500}, chosen


def test_pyramid_pooling_keeps_the_global_average_and_adds_the_four_quadrants():
    from dpsad.moco.model import ResNetEncoder

    torch.manual_seed(0)
    pyramid = ResNetEncoder(1, (8, 8, 8), pooling="pyramid").eval()
    mean = ResNetEncoder(1, (8, 8, 8), pooling="mean").eval()
    mean.load_state_dict(pyramid.state_dict())  # the same convolutions: only the pooling differs
    x = torch.rand(3, 1, 16, 16) * 2 - 1
    with torch.no_grad():
        out, maps = pyramid(x), pyramid.layers(pyramid.stem(x))
    assert pyramid.out_dim == 40 and out.shape == (3, 40)
    assert torch.allclose(out[:, :8], mean(x), atol=1e-6)
    quadrants = out[:, 8:].reshape(3, 8, 2, 2)  # channel-major, as flatten leaves adaptive_avg_pool2d's [N, C, 2, 2]
    assert torch.allclose(quadrants[:, :, 0, 0], maps[:, :, :2, :2].mean(dim=(2, 3)), atol=1e-6)  # the last map is 4x4
    assert torch.allclose(quadrants.mean(dim=(2, 3)), out[:, :8], atol=1e-6)
    with pytest.raises(ValueError, match="pooling = 'max', expected one of mean, pyramid"):
        ResNetEncoder(1, (8,), pooling="max")


def test_an_encoder_is_saved_and_loaded_with_its_pooling(tmp_path, log):
    from helpers import tiny_data

    from dpsad.moco.train import extract_features, load_encoder, train_moco

    settings = tiny_moco_settings(features="backbone", pooling="pyramid")
    data = tiny_data()
    train_moco(data, settings, "cpu", tmp_path / "enc.pt", tmp_path / "enc.json", tmp_path / "loss.csv", log)
    model = load_encoder(tmp_path / "enc.pt", "cpu")
    assert model.backbone.pooling == "pyramid" and not model.training
    extract_features(data, tmp_path / "enc.pt", "cpu", tmp_path / "features.h5", which="backbone",
                     ledger_entries=[])
    with h5py.File(tmp_path / "features.h5") as handle:
        assert handle["train"]["features"].shape == (24, 40)  # 5 x the last stage's 8 channels
    # an encoder saved before the pooling key existed was mean-pooled
    train_moco(data, {**settings, "pooling": "mean"}, "cpu", tmp_path / "old.pt", tmp_path / "old.json",
               tmp_path / "old.csv", log)
    state = torch.load(tmp_path / "old.pt", weights_only=False)
    del state["pooling"]
    torch.save(state, tmp_path / "old.pt")
    old = load_encoder(tmp_path / "old.pt", "cpu")
    assert old.backbone.pooling == "mean" and old.backbone.out_dim == 8


def test_supervised_contrastive_averages_over_the_keys_of_the_query_label():
    from dpsad.moco.model import supervised_contrastive

    q = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=1)
    keys = F.normalize(torch.tensor([[1.0, 0.2], [0.1, 1.0], [1.0, -0.3], [-1.0, 0.0], [0.6, 0.8]]), dim=1)
    key_labels = torch.tensor([0, 1, 0, 1, -1])  # the last key has no label: never a positive
    loss = supervised_contrastive(q, keys, torch.tensor([0, 1]), key_labels, 0.5)
    log_prob = torch.log_softmax(q @ keys.t() / 0.5, dim=1)
    expected = torch.stack([-(log_prob[0, 0] + log_prob[0, 2]) / 2, -(log_prob[1, 1] + log_prob[1, 3]) / 2])
    assert loss.shape == (2,) and torch.allclose(loss, expected, atol=1e-6)
    with pytest.raises(ValueError, match="no positive key"):
        supervised_contrastive(q, keys, torch.tensor([0, -1]), key_labels, 0.5)


def test_moco_with_labels_mixes_the_supervised_term_and_queues_the_labels():
    from dpsad.moco.model import MoCo, info_nce, supervised_contrastive

    torch.manual_seed(0)
    model = MoCo(1, feature_dim=8, queue_size=6, widths=(8,))
    x, labels = torch.rand(4, 1, 8, 8) * 2 - 1, torch.tensor([0, 1, 0, 2])
    queue = model.queue.clone()
    assert model.queue_labels.tolist() == [-1] * 6
    torch.manual_seed(1)
    loss = model(x, x, labels, label_weight=0.5)
    assert loss.shape == (4,)
    assert model.queue_labels.tolist() == [0, 1, 0, 2, -1, -1] and int(model.queue_ptr) == 4
    with torch.no_grad():  # recompute with the keys the step queued (the key encoder has moved once, as in the step)
        q = F.normalize(model.query(x), dim=1)
        k = model.queue[:4]
        expected = 0.5 * info_nce(q, k, queue, 0.2) + 0.5 * supervised_contrastive(
            q, torch.cat([k, queue]), labels, torch.cat([labels, torch.full((6,), -1)]), 0.2)
    assert torch.allclose(loss.detach(), expected, atol=1e-5)
    model(x, x)  # without labels the queue takes -1
    assert model.queue_labels.tolist() == [-1, -1, 0, 2, -1, -1]
    with pytest.raises(ValueError, match="label_weight = 0.5 needs the images' labels"):
        model(x, x, None, label_weight=0.5)


def test_moco_with_labels_says_so_in_its_ledger_and_trains_plain_moco_on_a_split_without_labels(tmp_path, log, caplog):
    from helpers import tiny_data

    from dpsad.data.datafile import Split
    from dpsad.moco.train import train_moco
    from dpsad.privacy.books.ledger import read_ledgers

    settings = tiny_moco_settings(label_weight=0.5)
    data = tiny_data()
    train_moco(data, settings, "cpu", tmp_path / "enc.pt", tmp_path / "enc.json", tmp_path / "loss.csv", log)
    (entry,) = read_ledgers([tmp_path / "enc.json"])
    assert entry["private"] is False and entry["notes"].endswith("public split and its labels")
    assert torch.load(tmp_path / "enc.pt", weights_only=False)["label_weight_used"] == 0.5
    data.splits["public"] = Split(data.splits["public"].images, None)
    with caplog.at_level("WARNING"):
        train_moco(data, settings, "cpu", tmp_path / "b.pt", tmp_path / "b.json", tmp_path / "b.csv", log)
    assert "moco.label_weight = 0.5, but the public split has no labels: training plain MoCo" in caplog.text
    assert torch.load(tmp_path / "b.pt", weights_only=False)["label_weight_used"] == 0.0
    (entry,) = read_ledgers([tmp_path / "b.json"])
    assert entry["notes"].endswith("public split")


def test_the_cluster_module_imports_scikit_learn_only_where_it_scores():
    """The evaluate stage imports :mod:`dpsad.moco.cluster` for its cluster-to-class map: a top-level scikit-learn
    import would cost each such job about a second for metrics it never computes."""
    import ast
    from pathlib import Path

    from dpsad.moco import cluster

    tree = ast.parse(Path(cluster.__file__).read_text())
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [getattr(node, "module", None) or "" for node in top_level] + [a.name for node in top_level for a in node.names]
    assert not [name for name in names if name.split(".")[0] == "sklearn"], names
    assert scores(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0]))["ari"] == 1.0  # imported where it scores
