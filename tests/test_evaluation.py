"""Evaluation metrics on cases whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsad.errors import DpsadError
from dpsad.evaluation.classifiers import ConvNet
from dpsad.evaluation.fidelity import fid, inception_score, precision_recall
from dpsad.evaluation.memorization import audit
from dpsad.evaluation.evaluate_stage import check_compatible
from dpsad.evaluation.table import comparison_rows, write_comparison
from dpsad.evaluation.utility import downstream_accuracy
from dpsad.synthetic import SyntheticData
from helpers import tiny_data


def blobs(n, classes=4, size=12, seed=0, noise=20):
    """Images with a bright square whose position encodes the class: an easy, learnable task."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    images = rng.integers(0, noise, (n, size, size, 1)).astype(np.int64)
    for i, c in enumerate(labels):
        r, col = divmod(int(c), 2)
        images[i, r * 6:r * 6 + 5, col * 6:col * 6 + 5, 0] += 200
    return np.clip(images, 0, 255).astype(np.uint8), labels.astype(np.int64)


def net(seed=0):
    torch.manual_seed(seed)
    return ConvNet(1, 4, 12).eval()


def test_fid_of_a_set_with_itself_is_about_zero_and_grows_with_noise():
    images, _ = blobs(300)
    model = net()
    assert abs(fid(model, images, images)) < 1e-3
    rng = np.random.default_rng(1)
    scores = []
    for sigma in (10, 40, 80):
        noisy = np.clip(images.astype(np.int64) + rng.normal(0, sigma, images.shape), 0, 255).astype(np.uint8)
        scores.append(fid(model, images, noisy))
    assert 0 < scores[0] < scores[1] < scores[2]


def test_inception_score_of_one_class_is_about_one():
    model = net()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([50.0, 0.0, 0.0, 0.0]))  # every image is class 0, confidently
    images, _ = blobs(200)
    mean, _ = inception_score(model, images)
    assert mean == pytest.approx(1.0, abs=1e-3)


def test_precision_and_recall_of_identical_sets_are_one():
    feats = np.random.default_rng(0).normal(size=(200, 16)).astype(np.float32)
    assert precision_recall(feats, feats.copy(), k=3) == (1.0, 1.0)
    far = feats + 100.0
    assert precision_recall(feats, far, k=3) == (0.0, 0.0)


def test_memorisation_audit_flags_planted_copies():
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (300, 12, 12, 1), dtype=np.uint8)
    test = rng.integers(0, 256, (300, 12, 12, 1), dtype=np.uint8)
    fresh = rng.integers(0, 256, (100, 12, 12, 1), dtype=np.uint8)
    clean = audit(fresh, train, test)
    assert clean["near_copies"] == 0 and 0.35 < clean["closer_to_train_share"] < 0.65 and 0.4 < clean["mia_auc"] < 0.6
    copied = np.concatenate([fresh[:60], train[:40]])
    flagged = audit(copied, train, test)
    assert flagged["near_copies"] == 40
    assert flagged["closer_to_train_share"] > clean["closer_to_train_share"]
    assert flagged["mia_auc"] > 0.55


def test_model_selection_never_reads_the_test_split():
    """Shuffling the test labels changes only the reported accuracy, never the selected models."""
    images, labels = blobs(240, seed=2)
    test_images, test_labels = blobs(80, seed=3)
    kwargs = dict(epochs=3, lr=1e-3, batch=32, holdout=0.2, seed=0)
    acc, selection = downstream_accuracy(images, labels, test_images, test_labels, 4, **kwargs)
    shuffled = np.random.default_rng(0).permutation(test_labels)
    acc2, selection2 = downstream_accuracy(images, labels, test_images, shuffled, 4, **kwargs)
    assert selection == selection2
    assert acc["cnn"] > 0.9 and acc["logreg"] > 0.9  # the task is learnable ...
    assert acc2["cnn"] < 0.6  # ... and the shuffled labels are only used to score


def test_cnn_accuracy_is_the_mean_of_several_trainings():
    images, labels = blobs(160, seed=4)
    test_images, test_labels = blobs(60, seed=5)
    acc, selection = downstream_accuracy(images, labels, test_images, test_labels, 4, epochs=2, lr=1e-3, batch=32,
                                         holdout=0.2, seed=0, cnn_trainings=3)
    assert len(acc["cnn_runs"]) == 3 and {"cnn", "cnn_1", "cnn_2"} <= set(selection)
    assert acc["cnn"] == pytest.approx(np.mean(acc["cnn_runs"]))
    assert acc["cnn_std"] == pytest.approx(np.std(acc["cnn_runs"], ddof=1))
    one, _ = downstream_accuracy(images, labels, test_images, test_labels, 4, epochs=2, lr=1e-3, batch=32, holdout=0.2,
                                 seed=0, cnn_trainings=1)
    assert one["cnn_runs"] == [one["cnn"]] and one["cnn_std"] == 0.0 and one["cnn"] == acc["cnn_runs"][0]


def test_the_downstream_classifiers_train_with_their_own_batch_size_and_the_evaluator_with_its_own(monkeypatch, tmp_path):
    """evaluate.classifier_batch_size reaches the MLP and every CNN training; evaluate.batch_size the evaluator."""
    import logging

    from dpsad.config import load_schema, validate_against
    from dpsad.evaluation import evaluate_stage as report, utility

    schema = load_schema()
    settings = validate_against({"evaluator_epochs": 1, "classifier_epochs": 1, "cnn_trainings": 2, "batch_size": 16,
                                 "classifier_batch_size": 4}, schema["properties"]["evaluate"] | {"$defs": schema["$defs"]})
    batches = {"evaluator": [], "downstream": []}

    def recording(kind, fit_select):
        def wrapped(model, *args, batch, **kwargs):
            batches[kind].append((type(model).__name__, batch))
            return fit_select(model, *args, batch=batch, **kwargs)
        return wrapped

    monkeypatch.setattr(report, "fit_select", recording("evaluator", report.fit_select))
    monkeypatch.setattr(utility, "fit_select", recording("downstream", utility.fit_select))
    data = tiny_data()
    report.train_evaluator(data, settings, tmp_path / "evaluator.pt", logging.getLogger("test"))
    report.evaluate_real(data, net(), settings, logging.getLogger("test"))
    assert batches["evaluator"] == [("ConvNet", 16)]
    assert batches["downstream"] == [("MLP", 4), ("ConvNet", 4), ("ConvNet", 4)]


def test_gap_closed_is_the_share_of_the_public_to_nonprivate_gap(tmp_path):
    import json

    paths = []
    for run, method, cnn in (("public", "public", 0.6), ("nonprivate", "nonprivate", 0.9), ("dpsad_eps10", "dpsad", 0.75)):
        (tmp_path / "toy" / run).mkdir(parents=True)
        path = tmp_path / "toy" / run / "metrics.json"
        path.write_text(json.dumps({"run": run, "method": method, "accuracy": {"cnn": cnn, "cnn_std": 0.01}}))
        paths.append(str(path))
    rows = {row["run"]: row for row in comparison_rows(paths)}
    assert rows["dpsad_eps10"]["gap_closed"] == pytest.approx(0.5)
    assert rows["dpsad_eps10"]["cnn_gain_over_public"] == pytest.approx(0.15)
    assert rows["nonprivate"]["gap_closed"] == pytest.approx(1.0) and rows["public"]["gap_closed"] is None
    assert rows["dpsad_eps10"]["acc_cnn_std"] == 0.01


def test_incompatible_synthetic_data_is_refused():
    data = tiny_data(size=12, classes=3)
    wrong_size = SyntheticData(np.zeros((4, 28, 28, 1), np.uint8), np.zeros(4, np.int64), {"class_names": '["0", "1", "2"]'})
    with pytest.raises(DpsadError, match="expected \\(12, 12, 1\\)"):
        check_compatible(wrong_size, data)
    wrong_classes = SyntheticData(np.zeros((4, 12, 12, 1), np.uint8), np.zeros(4, np.int64), {"class_names": '["a", "b"]'})
    with pytest.raises(DpsadError, match="class names"):
        check_compatible(wrong_classes, data)
    check_compatible(wrong_classes, data, classes=False)  # the Inception figures: a k-means run's clusters pass
    with pytest.raises(DpsadError, match="expected \\(12, 12, 1\\)"):
        check_compatible(wrong_size, data, classes=False)


def test_comparison_table(tmp_path):
    import json

    run_dir = tmp_path / "toy" / "dpsad_eps1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({
        "run": "dpsad_eps1", "method": "dpsad", "epsilon": 0.99, "delta": 1e-5, "dp_guarantee": True, "target_epsilon": 1.0,
        "n_samples": 10, "fid_evaluator": 3.5, "is_evaluator": 2.0, "precision": 0.5, "recall": 0.4,
        "accuracy": {"logreg": 0.8, "mlp": 0.85, "cnn": 0.9},
        "memorization": {"closer_to_train_share": 0.5, "near_copies": 0, "mia_auc": 0.5}}))
    rows = comparison_rows([str(run_dir / "metrics.json")])
    assert rows[0]["fid_inception"].startswith("not computed: no Inception-v3 weights configured")
    write_comparison(rows, tmp_path / "c.csv", tmp_path / "c.md")
    text = (tmp_path / "c.md").read_text()
    assert "| toy | dpsad_eps1 | dpsad | true | 1 | 0.99 | - | 1e-05 | yes |" in text and "n/c" in text
    assert (tmp_path / "c.csv").read_text().splitlines()[1].startswith("toy,dpsad_eps1,dpsad")
    figures = tmp_path / "toy" / "inception.json"  # the dataset's inception_figures stage: its row by run name
    figures.write_text(json.dumps({"real": {"fid_inception": 1.0}, "dpsad_eps1": {"fid_inception": 7.5, "is_inception": 1.2}}))
    (row,) = comparison_rows([str(run_dir / "metrics.json")], [str(figures)])
    assert (row["fid_inception"], row["is_inception"]) == (7.5, 1.2) and row["kid_inception"].startswith("not computed")


def test_the_inception_stage_scores_the_real_row_and_every_run_against_the_test_split():
    from dpsad.evaluation.inception import KEYS, row_figures

    rng = np.random.default_rng(0)
    test, train = (rng.integers(0, 256, (n, 8, 8, 1), dtype=np.uint8) for n in (6, 20))
    settings = {"inception_weights": None, "inception_samples": 10, "seed": 0}
    figures = row_figures(test, train, {"a": test[:3], "b": train}, settings)
    assert list(figures) == ["real", "a", "b"] and all(set(f) == set(KEYS) for f in figures.values())
    assert all(value.startswith("not computed: no Inception-v3 weights") for f in figures.values() for value in f.values())


def test_sweep_table_keeps_guaranteed_points_and_the_public_reference(tmp_path):
    from dpsad.evaluation.sweep import sweep_table, write_sweep
    from dpsad.plots import utility_against_epsilon

    rows = [
        {"method": "public", "epsilon": 0.0, "dp_guarantee": True, "acc_cnn": 0.8},
        {"method": "nonprivate", "epsilon": None, "dp_guarantee": False, "acc_cnn": 0.95},
        {"method": "dpsad", "epsilon": 9.98, "dp_guarantee": True, "acc_cnn": 0.83, "acc_cnn_std": 0.02},
        {"method": "dpsad", "epsilon": 0.99, "dp_guarantee": True, "acc_cnn": 0.81},
        {"method": "dpdm", "epsilon": 1.0, "dp_guarantee": False, "acc_cnn": 0.9},  # no guarantee: not a point
        {"method": "dpdm", "epsilon": 5.0, "dp_guarantee": True, "acc_cnn": "not computed (unconditional)"},
    ]
    table = sweep_table(rows)
    assert table["public"] == 0.8 and table["nonprivate"] == 0.95
    assert table["points"] == [("dpsad", 0.99, 0.81, 0.0), ("dpsad", 9.98, 0.83, 0.02)]
    write_sweep(table, tmp_path / "sweep.csv")
    assert (tmp_path / "sweep.csv").read_text().splitlines()[1] == "dpsad,0.99,0.81,0.0,0.8,0.95"
    utility_against_epsilon(table, tmp_path / "sweep.png", "t")
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_frechet_distance_matches_the_closed_form_for_diagonal_gaussians():
    from dpsad.evaluation.fidelity import frechet_distance

    mean_a, mean_b = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    var_a, var_b = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
    expected = ((mean_a - mean_b) ** 2).sum() + (var_a + var_b - 2 * np.sqrt(var_a * var_b)).sum()
    assert frechet_distance(mean_a, np.diag(var_a), mean_b, np.diag(var_b)) == pytest.approx(expected, rel=1e-9)
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]  # a basis change leaves it unchanged
    rotated = frechet_distance(rotation @ mean_a, rotation @ np.diag(var_a) @ rotation.T, rotation @ mean_b,
                               rotation @ np.diag(var_b) @ rotation.T)
    assert rotated == pytest.approx(expected, rel=1e-9)


def test_inception_score_of_evenly_spread_confident_classes_is_their_number():
    class FirstPixelClass(torch.nn.Module):  # class k for images whose first pixel is k: confident, four classes
        def forward(self, x):
            return 100.0 * torch.nn.functional.one_hot((x[:, 0, 0, 0] * 255).round().long(), 4).double()

    images = np.zeros((400, 4, 4, 1), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(400) % 4
    mean, std = inception_score(FirstPixelClass(), images, splits=1)
    assert mean == pytest.approx(4.0, rel=1e-9) and std == 0.0
    images[:300, 0, 0, 0] = 0  # mostly one class: exp(H(p(y))) of (13/16, 1/16, 1/16, 1/16)
    shares = np.array([0.75 + 0.25 / 4] + [0.25 / 4] * 3)
    mean, _ = inception_score(FirstPixelClass(), images, splits=1)
    assert mean == pytest.approx(np.exp(-(shares * np.log(shares)).sum()), rel=1e-9)


def test_roc_auc_counts_ties_as_half():
    from dpsad.evaluation.memorization import roc_auc

    assert roc_auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert roc_auc(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 0.0
    assert roc_auc(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.5
    assert roc_auc(np.array([2.0, 0.0]), np.array([1.0, 2.0])) == pytest.approx((0.5 + 1 + 0 + 0) / 4)


def test_frechet_distance_matches_the_reference_formula_with_scipys_sqrtm():
    """The reference implementations (pytorch-fid, TTUR) compute Tr(A + B - 2 sqrtm(A B)) with scipy's sqrtm."""
    from scipy import linalg

    from dpsad.evaluation.fidelity import frechet_distance

    rng = np.random.default_rng(3)
    for dim in (2, 8, 32):
        x, y = rng.normal(size=(200, dim)), rng.normal(size=(200, dim)) @ rng.normal(size=(dim, dim)) + 0.5
        mean_a, mean_b = x.mean(0), y.mean(0)
        cov_a, cov_b = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
        root = linalg.sqrtm(cov_a @ cov_b).real
        reference = float(((mean_a - mean_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root))
        assert frechet_distance(mean_a, cov_a, mean_b, cov_b) == pytest.approx(reference, rel=1e-6)


@pytest.fixture(scope="module")
def inception_weights(tmp_path_factory) -> str:
    """One random-weight file for the tests below (the net is built and saved once: 100 MB)."""
    return random_inception_weights(tmp_path_factory.mktemp("inception") / "inception.pth")


def random_inception_weights(path) -> str:
    """torch-fidelity's Inception-v3 with random weights, saved where its own loader reads it: built offline (its
    download and its load replaced while the module is made; nothing else)."""
    from unittest import mock

    import torch_fidelity.feature_extractor_inceptionv3 as module

    with mock.patch.object(module, "load_state_dict_from_url", lambda *a, **k: None), \
            mock.patch.object(module.FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None):
        torch.manual_seed(0)
        net = module.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    for layer in net.modules():  # variance-keeping weights: features that differ between images
        if isinstance(layer, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
    torch.save(net.state_dict(), path)
    return str(path)


@pytest.mark.e2e  # a minute of Inception-v3 at 299 x 299 on the CPU
def test_inception_figures_are_the_librarys_own_on_the_same_images(inception_weights):
    import torch_fidelity

    from dpsad.evaluation.inception import _Images, inception_metrics, row_figures

    rng = np.random.default_rng(0)
    real = rng.integers(0, 256, (10, 16, 16, 1), dtype=np.uint8)
    fake = np.clip(real.astype(int) + rng.integers(-40, 40, real.shape), 0, 255).astype(np.uint8)
    missing = inception_metrics(real, fake, None)
    assert all(value.startswith("not computed: no Inception-v3 weights configured") for value in missing.values())
    with pytest.raises(DpsadError, match="evaluate.inception_weights '/nonexistent.pth' cannot be read"):
        inception_metrics(real, fake, "/nonexistent.pth")
    weights = inception_weights
    import torch_fidelity.utils
    from unittest import mock

    loaders = []
    with mock.patch.object(torch_fidelity.utils, "DataLoader",
                           lambda *a, **k: loaders.append(k["num_workers"]) or torch.utils.data.DataLoader(*a, **k)):
        # the stage's rows share the test split's features, computed once: here the real row is a reordering of
        # the test images, and the fake row is inception_metrics(real, fake) (KID on subsets of all 10 images, the
        # Inception Score on ten splits)
        rows = row_figures(real, real[::-1], {"fake": fake},
                           {"inception_weights": weights, "inception_samples": 10, "seed": 0})
    assert loaders and set(loaders) == {0}  # the images are in memory: no loader processes (on two cores each warned)
    ours = rows["fake"]
    grey_as_rgb = np.repeat(real, 3, axis=-1)  # the library's own call, on the images made three-channel by hand
    theirs = torch_fidelity.calculate_metrics(
        input1=_Images(np.repeat(fake, 3, axis=-1)), input2=_Images(grey_as_rgb), isc=True, fid=True, kid=True,
        kid_subset_size=10, feature_extractor_weights_path=weights, cache=False, verbose=False,
        cuda=torch.cuda.is_available(), save_cpu_ram=True)  # the device ours ran on: a GPU's TF32 convolutions
    # move FID by 2e-4 from the CPU's; loader processes change no figure (on two cores each warned)
    assert ours["fid_inception"] == pytest.approx(theirs["frechet_inception_distance"], rel=1e-6)
    assert ours["is_inception"] == pytest.approx(theirs["inception_score_mean"], rel=1e-6)
    assert ours["kid_inception"] == pytest.approx(theirs["kernel_inception_distance_mean"], rel=1e-6, abs=1e-9)
    assert list(rows) == ["real", "fake"] and abs(rows["real"]["fid_inception"]) < 1e-3 < ours["fid_inception"]


@pytest.mark.e2e  # the tiny run's rows through Inception-v3 at 299 x 299 on the CPU
def test_with_a_weights_file_every_row_of_the_table_has_inception_figures_and_nothing_else_reruns(tiny_run, tmp_path,
                                                                                                    inception_weights):
    import csv
    import shutil

    from workflow_helpers import planned_jobs, snakemake

    cwd = tmp_path / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)
    weights = inception_weights
    overlay = cwd / "inception.yaml"
    overlay.write_text(f"evaluate: {{inception_weights: '{weights}', inception_samples: 10}}\n")
    args = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", str(overlay))
    before = list(csv.DictReader((cwd / "results" / "comparison.csv").open()))
    assert before and all(row["fid_inception"].startswith("not computed") for row in before)
    planned = planned_jobs(snakemake(cwd, "-n", "all", *args))
    assert planned == {"inception_figures": 1, "compare": 1, "all": 1}, planned  # no classifier is trained again
    snakemake(cwd, "--cores", "2", "all", *args)
    rows = list(csv.DictReader((cwd / "results" / "comparison.csv").open()))
    assert [row["run"] for row in rows] == [row["run"] for row in before]
    for row in rows:
        for key in ("fid_inception", "is_inception", "kid_inception"):
            assert np.isfinite(float(row[key])), (row["run"], key, row[key])
