"""The DP warm-up without public data: central images under the Gaussian mechanism, composed into every descendant."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from test_workflow import snakemake, workdir

from dpsad.privacy.books.image_digests import record_digests
from dpsad.errors import DpsadError
from dpsad.privacy.mechanism.group_means import groups_of_records, members_of_groups, noisy_group_sums, pooled
from dpsad.job_spending import embedded_entries
from dpsad.privacy.books.ledger import read_ledgers


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16, 1), dtype=np.uint8)


def test_a_group_that_is_not_disjoint_is_refused():
    x = pooled(images(6), 8)
    with pytest.raises(DpsadError, match="record 2 is in 2 groups, expected disjoint groups"):
        noisy_group_sums(x, [np.array([0, 1, 2]), np.array([2, 3]), np.array([4, 5])], clip_norm=1.0,
                         noise_multiplier=1.0, generator=torch.Generator().manual_seed(0))


def test_a_records_group_does_not_depend_on_the_other_records():
    data = images(200)
    labels = np.arange(200) % 10
    with_all = groups_of_records(record_digests(data), labels, 4, key=123)
    without_first = groups_of_records(record_digests(data[1:]), labels[1:], 4, key=123)
    assert (with_all[1:] == without_first).all()
    assert set(np.unique(with_all)) <= set(range(40)) and (with_all // 4 == labels).all()


def test_one_record_moves_the_noiseless_sums_by_at_most_the_clip_bound():
    data, labels = images(300), np.arange(300) % 10
    x = pooled(data, 8)
    for leave_out in (0, 17, 299):
        keep = np.delete(np.arange(300), leave_out)
        full = noisy_group_sums(x, members_of_groups(groups_of_records(record_digests(data), labels, 3, 7), 30),
                                clip_norm=1.5, noise_multiplier=0.0, generator=torch.Generator())
        groups = groups_of_records(record_digests(data[keep]), labels[keep], 3, 7)
        less = noisy_group_sums(x[keep], members_of_groups(groups, 30), clip_norm=1.5, noise_multiplier=0.0,
                                generator=torch.Generator())
        assert 0 < float((full - less).norm()) <= 1.5 + 1e-5


def test_the_noise_on_each_coordinate_has_standard_deviation_sigma_times_c():
    x = torch.zeros(4000, 1, 8, 8)
    sums = noisy_group_sums(x, [np.array([i]) for i in range(4000)], clip_norm=2.0, noise_multiplier=3.0,
                            generator=torch.Generator().manual_seed(1))
    assert float(sums.std()) == pytest.approx(6.0, rel=0.02)


@pytest.mark.e2e
def test_the_warm_ups_cost_is_in_every_ledger_that_descends_from_it(tmp_path):
    """The no-public configuration at tiny size: the central images' entry, the same use once, in the warm-up
    teacher's ledger, a warm-started DPDM's, a DP-SAD student's and a DP teacher's student's, and each run's
    epsilon composed from it meets its target."""
    cwd = workdir(tmp_path)
    runs = ("dpdm_central_eps10", "dpsad_central_eps1", "dpsad_dpteacher_eps10")
    snakemake(cwd, "--cores", "2", "--replace-workflow-config", "--configfile", "config/examples/no_public.yaml",
              "tests/data/no_public_tiny.yaml", "--", *(f"results/mnist5k_nopub/{run}/privacy.json" for run in runs))
    results = cwd / "results" / "mnist5k_nopub"
    (central,) = read_ledgers([results / "central.ledger.json"])
    assert central["stage"] == "central_images" and central["mechanism"] == "gaussian" and central["private"]
    teacher = read_ledgers([results / "teacher" / "central.ledger.json"])
    assert [e["uid"] for e in teacher if e["private"]] == [central["uid"]]
    for run, target in zip(runs, (10.0, 1.0, 10.0)):
        verdict = json.loads((results / run / "privacy.json").read_text())
        uids = [c["uid"] for c in verdict["components"]]
        assert uids.count(central["uid"]) == 1, run
        assert verdict["dp_guarantee"] is True and 0 < verdict["epsilon"] <= target, (run, verdict["epsilon"])
    stages = [c["stage"] for c in json.loads((results / "dpsad_dpteacher_eps10" / "privacy.json").read_text())["components"]]
    assert stages[0] == "central_images" and "train_teacher[dp_eps5]" in stages


def test_a_central_teacher_on_kmeans_labels_is_refused_whichever_teacher_it_is():
    import yaml

    from dpsad.config import validate_config
    from test_workflow import ROOT

    config = yaml.safe_load((ROOT / "config" / "examples" / "no_public.yaml").read_text())
    config["teachers"]["second"] = {**config["teachers"]["central"], "labels": "kmeans"}
    with pytest.raises(DpsadError, match="teachers.second.labels = kmeans with split: central"):
        validate_config(config)


def test_a_label_set_derived_from_the_private_labels_costs_every_runs_guarantee(tmp_path, log):
    """One added record with a new label changes the warm-up's shape; the verdict must not claim a guarantee for
    any run of such a dataset, ``labels: none`` included.  A separate public source that fixes the class set
    makes the label set public."""
    from dpsad.data.central_split import build_central_images
    from dpsad.data.datafile import prepare, read_attrs
    from dpsad.privacy.books.ledger import label_set_reasons, verdict

    settings = {"groups_per_class": 2, "resolution": 8, "clip_norm": 4.0, "epsilon": 0.2, "accountant": "rdp",
                "augmented_copies": 0, "max_shift": 0, "seed": 0, "noise_seed": None}
    shapes, reasons = {}, {}
    for name, n in (("d", 300), ("d_plus_one", 301)):
        labels = np.arange(n) % 3
        labels[-1] = 3 if n == 301 else labels[-1]  # the added record carries a label nobody else has
        np.savez(tmp_path / f"{name}.npz", images=images(n, seed=0), labels=labels)
        data = tmp_path / f"{name}.h5"
        prepare({"source": "npz", "path": str(tmp_path / f"{name}.npz"), "test_fraction": 0.2, "public_fraction": 0.1,
                 "private_fraction": 0.9, "seed": 0}, name, data)
        build_central_images(data, tmp_path / f"{name}_central.h5", tmp_path / f"{name}_central.json", settings,
                             1e-5, log)
        with h5py.File(tmp_path / f"{name}_central.h5", "r") as handle:
            shapes[name] = len(handle["central"]["images"])
        assert embedded_entries(tmp_path / f"{name}_central.h5") == read_ledgers([tmp_path / f"{name}_central.json"])
        reasons[name] = label_set_reasons(read_attrs(data), name)
    print(shapes, reasons)
    assert shapes == {"d": 6, "d_plus_one": 8}  # the release's shape follows the private labels
    for name, found in reasons.items():
        assert found and f"data.{name}.class_names is not configured" in found[0]
        result = verdict([], delta=1e-5, accountant="pld", target_epsilon=None, num_private_records=300,
                         extra_reasons=found)
        assert result["dp_guarantee"] is False
    # the same records beside a public source whose class set is configured: the label set is public
    public = tmp_path / "public.npz"
    np.savez(public, images=images(40, seed=5), labels=np.arange(40) % 3)
    fixed = tmp_path / "fixed.h5"
    prepare({"source": "npz", "path": str(tmp_path / "d.npz"), "public": {"source": "npz", "path": str(public),
             "num_classes": 3}, "test_fraction": 0.2, "private_fraction": 1.0, "seed": 0}, "fixed", fixed)
    assert label_set_reasons(read_attrs(fixed), "fixed") == []
    # a private label outside that public set is refused before anything is computed
    with pytest.raises(DpsadError, match="class names"):
        prepare({"source": "npz", "path": str(tmp_path / "d_plus_one.npz"), "public": {
            "source": "npz", "path": str(public), "num_classes": 3}, "test_fraction": 0.2,
            "private_fraction": 1.0, "seed": 0}, "fixed", tmp_path / "refused.h5")
