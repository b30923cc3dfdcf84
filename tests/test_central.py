"""The DP warm-up without public data: central images under the Gaussian mechanism, composed into every descendant."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_workflow import snakemake, workdir

from dpsad.data.records import record_digests
from dpsad.errors import DpsadError
from dpsad.privacy.central import groups_of_records, members_of_groups, noisy_group_sums, pooled
from dpsad.privacy.ledger import read_ledgers


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
