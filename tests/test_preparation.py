"""Every use of the private records names the preparation of data.h5 it read; a training kept past a new
preparation (``--touch``) is refused by the verdict and by the budget, before the curator's record is touched."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import yaml
from conftest import indexed_images
from test_records_budget import BUDGET, dp_run, public_run, release_budget, settings
from test_release_budget import copy_of
from workflow_helpers import snakemake

from dpsad import release_folder
from dpsad.data.datafile import SPLITS, prepare, read_attrs, read_datafile
from dpsad.data.pseudo_labels import read_pseudo_labels, write_pseudo_labels
from dpsad.errors import DpsadError, PrivacyError
from dpsad.moco.cluster import feature_kinds
from dpsad.privacy.accounting import Accountant
from dpsad.privacy.books.curator_record import CuratorRecord
from dpsad.privacy.books.ledger import components_of, make_entry
from dpsad.privacy.books.preparation import RECORDS, RECORDS_ID, records_problem, stamped
from dpsad.privacy.books.public_preparation import PUBLIC_RECORDS, public_records_problem, stamped_public


def test_each_preparation_draws_its_own_id_and_a_run_trained_on_another_is_refused_before_anything_is_recorded(
        tmp_path, npz_file):
    first, again = tmp_path / "first.h5", tmp_path / "again.h5"
    prepare(settings(npz_file), "toy", first)
    prepare(settings(npz_file), "toy", again)  # the same records, prepared again
    ids = read_attrs(first)[RECORDS_ID], read_attrs(again)[RECORDS_ID]
    assert len(set(ids)) == 2 and all(len(i) == 32 for i in ids)  # drawn, not computed from the records
    run = dp_run()
    stamped(run["components"], read_attrs(first))
    curator, budget_path = tmp_path / "curator", tmp_path / "release" / "toy" / "BUDGET.json"
    with pytest.raises(PrivacyError) as err:
        release_folder.release_budget(budget_path, dataset="toy", data_path=again, listed=[("dp", run)], budget=BUDGET,
                                      curator_dir=curator)
    message = str(err.value)
    assert "\n" not in message and message.startswith("run 'dp': distill_student read another preparation")
    assert "--forcerun prepare_data" in message
    assert not budget_path.exists() and not curator.exists()  # refused before the curator's record is opened
    # on the preparation it read, the same run is released
    assert release_folder.release_budget(budget_path, dataset="toy", data_path=first, listed=[("dp", run)],
                                         budget=BUDGET, curator_dir=curator)["runs"][0]["released"]


def test_a_use_names_its_preparation_and_only_uses_of_the_private_records_are_compared(tmp_path, npz_file):
    prepare(settings(npz_file), "toy", tmp_path / "toy.h5")
    attrs = read_attrs(tmp_path / "toy.h5")
    private, public = dp_run()["components"][0], public_run()["components"][0]
    assert records_problem([private], attrs).startswith("distill_student read another preparation")  # names none
    stamped([private, public], attrs)
    assert private[RECORDS] == attrs[RECORDS_ID] and RECORDS not in public
    assert records_problem([private, public], attrs) is None
    older = {k: v for k, v in attrs.items() if k != RECORDS_ID}  # a data.h5 written before the id
    assert records_problem([private], older) is not None
    assert records_problem([stamped([dp_run()["components"][0]], older)[0]], older) is None  # none on both sides
    # a run without a guarantee releases nothing of the records: the budget does not ask which ones it read
    unstamped = {**dp_run(), "dp_guarantee": False}
    assert release_folder.release_budget(tmp_path / "release" / "toy" / "BUDGET.json", dataset="toy",
                                         data_path=tmp_path / "toy.h5", listed=[("no", unstamped)], budget=BUDGET,
                                         curator_dir=tmp_path / "c")["runs"][0]["released"] is False


def test_labels_and_features_of_another_preparation_are_refused_by_the_stages_reading_them(tmp_path, npz_file):
    """Row i of a labels.h5 or features.h5 describes record i of the preparation it was computed from: paired with
    another preparation's records it would carry the old records into a training that names only the new ones."""
    first, again = tmp_path / "first.h5", tmp_path / "again.h5"
    prepare(settings(npz_file), "toy", first)
    prepare(settings(npz_file), "toy", again)
    old, new = read_attrs(first), read_attrs(again)
    labels = tmp_path / "labels.h5"
    write_pseudo_labels(labels, {s: np.zeros(3, np.int64) for s in SPLITS}, ["c0"], fit_split="public",
                        features="moco", ledger_entries=[], data_attrs=old)
    assert read_pseudo_labels(labels, old)[1] == ["c0"]
    with pytest.raises(DpsadError) as err:
        read_pseudo_labels(labels, new)
    assert "\n" not in str(err.value) and "computed from another preparation of the private records" in str(err.value)
    before = {k: v for k, v in old.items() if k != RECORDS_ID}  # files and data.h5 written before the id agree
    write_pseudo_labels(labels, {s: np.zeros(3, np.int64) for s in SPLITS}, ["c0"], fit_split="public",
                        features="moco", ledger_entries=[], data_attrs=before)
    assert read_pseudo_labels(labels, before)[1] == ["c0"]
    with pytest.raises(DpsadError):
        read_pseudo_labels(labels, new)
    features = tmp_path / "features.h5"
    with h5py.File(features, "w") as handle:
        for name in SPLITS:
            handle.create_group(name).create_dataset("features", data=np.zeros((3, 2), np.float32))
        handle.attrs[RECORDS_ID] = old[RECORDS_ID]
    with pytest.raises(DpsadError, match="computed from another preparation"):
        feature_kinds(read_datafile(again), features, ("moco",))
    assert feature_kinds(read_datafile(first), features, ("moco",))["moco"]["train"].shape == (3, 2)


def test_a_training_released_before_for_other_records_is_refused_even_where_no_preparation_is_named(tmp_path, npz_file):
    """The curator's record knows which records each released training was counted for: one released before for
    another set of records (a data.h5 prepared again from other records, the training kept) is refused, as for
    trainings written before the preparation id."""
    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(200, seed=1), labels=np.arange(200) % 4)  # other records
    prepare(settings(npz_file), "toy", tmp_path / "a.h5")
    prepare(settings(other), "toy", tmp_path / "b.h5")
    curator, run, roomy = tmp_path / "curator", dp_run(), {**BUDGET, "epsilon": 100.0}
    release_budget(tmp_path / "ra" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "a.h5",
                   listed=[("dp", run)], budget=BUDGET, curator_dir=curator)
    before = record_rows(curator)
    with pytest.raises(PrivacyError) as err:  # stamped with b's preparation: only the record can tell
        release_budget(tmp_path / "rb" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "b.h5",
                       listed=[("dp", run)], budget=roomy, curator_dir=curator)
    assert "run 'dp' builds on a training released before as toy/dp for other private records" in str(err.value)
    assert record_rows(curator) == before and not (tmp_path / "rb").exists()  # refused before anything is kept
    # a new training on b's records is released
    assert release_budget(tmp_path / "rb" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "b.h5",
                          listed=[("dp", dp_run())], budget=roomy, curator_dir=curator)["runs"][0]["released"]


def test_a_training_released_before_for_the_same_records_is_never_refused_for_it(tmp_path, npz_file):
    """The record check refuses only other records: a DP teacher shared by two runs of one dataset, released one
    after the other, and a training on the same records under a second dataset name (its own preparation, so its
    own training: one use is stamped with one preparation) both pass."""
    prepare(settings(npz_file), "toy", tmp_path / "toy.h5")
    prepare(settings(npz_file), "toy_copy", tmp_path / "toy_copy.h5")
    curator, roomy = tmp_path / "curator", {**BUDGET, "epsilon": 100.0}
    teacher = make_entry(stage="train_teacher[private]", private=True, mechanism="sgm", sample_rate=0.02,
                         noise_multiplier=1.0, steps=100, clip_norm=1.0, noise_seed="secret")
    first, second = dp_run(), dp_run()
    for run in (first, second):
        run["components"] = [dict(teacher), *run["components"]]
        run["epsilon"] = Accountant("pld").epsilon(components_of(run["components"]), 1e-5)
    release_budget(tmp_path / "r1" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("first", first)], budget=roomy, curator_dir=curator)
    later = release_budget(tmp_path / "r2" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                           listed=[("second", second)], budget=roomy, curator_dir=curator)
    assert later["runs"][-1]["released"] and later["released_before"] == ["toy/first"]
    copy = release_budget(tmp_path / "r3" / "toy_copy" / "BUDGET.json", dataset="toy_copy",
                          data_path=tmp_path / "toy_copy.h5", listed=[("third", dp_run())], budget=roomy,
                          curator_dir=curator)
    assert copy["runs"][-1]["released"] and copy["released_before_as"] == ["toy"]


def record_rows(curator) -> list:
    with CuratorRecord(curator).transaction(create=False) as record:
        return [row.body for row in record.rows()]


def stages_naming(results, private: bool, key: str, expected: str) -> set[str]:
    """The stages of every ledger under ``results`` with an entry of the ``private`` split, each of which holds
    ``key`` = ``expected``."""
    stages = set()
    for ledger in results.rglob("*ledger*.json"):
        for entry in json.loads(ledger.read_text())["entries"]:
            if entry["private"] == private:
                assert entry.get(key) == expected, (ledger, entry["stage"])
                stages.add(entry["stage"])
    return stages


@pytest.mark.e2e
def test_every_private_use_in_a_run_names_the_preparation_it_read(tiny_run):
    """Each stage that reads the private split (the DP trainings, PE, the cluster report) stamps its entries."""
    results = tiny_run / "results" / "mnist5k"
    expected = read_attrs(results / "data.h5")[RECORDS_ID]
    stages = stages_naming(results, True, RECORDS, expected)
    assert {"distill_student", "discriminator", "private_evolution", "train_dpgan_critic", "train_dpdm",
            "train_teacher[private]", "cluster_report"} <= stages, stages
    for per_record in ("labels.h5", "moco/features.h5"):  # the files whose rows describe the private records
        with h5py.File(results / per_record) as handle:
            assert handle.attrs[RECORDS_ID] == expected
    privacy = json.loads((results / "dpsad_eps10" / "privacy.json").read_text())
    assert privacy["dp_guarantee"] and all(c[RECORDS] == expected for c in privacy["components"] if c["private"])


@pytest.mark.e2e
def test_every_use_of_the_public_split_in_a_run_names_the_preparation_it_read(tiny_run):
    """The public teacher, MoCo and k-means on public features stamp theirs too (public_preparation)."""
    results = tiny_run / "results" / "mnist5k"
    expected = read_attrs(results / "data.h5")[RECORDS_ID]
    stages = stages_naming(results, False, PUBLIC_RECORDS, expected)
    assert {"train_teacher[public]", "train_moco", "kmeans_labels"} <= stages, stages
    public = json.loads((results / "public" / "privacy.json").read_text())
    assert public["dp_guarantee"] and [c[PUBLIC_RECORDS] for c in public["components"]] == [expected]


def test_a_use_of_another_preparations_public_split_is_refused_by_the_verdict_and_the_budget(tmp_path, npz_file):
    data = tmp_path / "data.h5"
    prepare(settings(npz_file), "toy", data)
    attrs = read_attrs(data)
    teacher = make_entry(stage="train_teacher[public]", private=False, mechanism="none", steps=8)
    student = make_entry(stage="distill_student", private=True, mechanism="sgm", sample_rate=0.01,
                         noise_multiplier=1.0, steps=10, clip_norm=1.0, noise_seed="secret")
    entries = stamped_public(stamped([teacher, student], attrs), attrs)
    assert teacher[PUBLIC_RECORDS] == attrs[RECORDS_ID] and PUBLIC_RECORDS not in student and RECORDS not in teacher
    assert public_records_problem(entries, attrs) is None
    unstamped = {k: v for k, v in teacher.items() if k != PUBLIC_RECORDS}  # written before 0.3.1: not known, passes
    assert public_records_problem([unstamped, student], attrs) is None
    kept = {**teacher, PUBLIC_RECORDS: "an-earlier-preparation"}  # kept by --touch past a new data.h5
    problem = public_records_problem([kept, student], attrs, "results/toy/data.h5")
    assert problem.startswith("train_teacher[public] trained without noise on another preparation of "
                              "results/toy/data.h5 (its public split")
    assert records_problem([kept, student], attrs) is None  # the private uses alone would pass it
    public = {"dp_guarantee": True, "epsilon": 0.0, "components": [kept]}
    with pytest.raises(PrivacyError, match=r"run 'public': train_teacher\[public\] trained without noise on another"):
        release_folder.check_runs_read_these_records([("public", public)], attrs, data)
    release_folder.check_runs_read_these_records([("public", {**public, "components": [teacher]})], attrs, data)
    # a run that states no guarantee releases none: its verdict already says why
    release_folder.check_runs_read_these_records([("public", {**public, "dp_guarantee": False})], attrs, data)


@pytest.mark.e2e
def test_trainings_kept_by_touch_past_a_new_preparation_are_refused(tiny_run, tmp_path_factory):
    """The data prepared again, the trainings, labels and verdicts kept by --touch: the budget refuses the runs, a
    training started again refuses the old k-means labels, and an account run again states no guarantee, naming the
    stage (a private split's use, or the public teacher's use of the old public split)."""
    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=True)
    args = ("--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml")
    snakemake(cwd, "results/mnist5k/data.h5", "--forcerun", "prepare_data", *args)
    listed = yaml.safe_load((cwd / "tests" / "data" / "tiny.yaml").read_text())["data"]["mnist5k"]["release"]
    privacy = [f"results/mnist5k/{run}/privacy.json" for run in listed]  # every listed run kept: none trains again
    snakemake(cwd, *privacy, "--touch", *args)
    refused = snakemake(cwd, "release", *args, check=False)
    output = refused.stdout + refused.stderr
    # the first listed run's refusal: the public run, whose teacher read the old preparation's public split
    assert refused.returncode != 0 and ("run 'public': train_teacher[public] trained without noise on another "
                                        "preparation") in output
    assert not (cwd / "release" / "mnist5k" / "BUDGET.json").exists()
    # a training started again on the new records, with the k-means labels of the old ones kept: refused
    student = "results/mnist5k/dpsad_kmeans_eps10/student.pt"
    retrained = snakemake(cwd, student, "--forcerun", "distill_student", "--allowed-rules", "distill_student", *args,
                          check=False)
    assert retrained.returncode != 0
    assert "labels.h5: computed from another preparation of the private records" in (retrained.stdout
                                                                                       + retrained.stderr)
    stale = "results/mnist5k/dpsad_eps10/privacy.json"
    snakemake(cwd, stale, "--forcerun", "account", "--allowed-rules", "account", *args)
    verdict = json.loads((cwd / stale).read_text())
    assert verdict["dp_guarantee"] is False
    assert any("read another preparation of the private records" in reason for reason in verdict["reasons"])
    # the public run: its teacher read the public split of the old preparation (read no private record)
    public = "results/mnist5k/public/privacy.json"
    snakemake(cwd, public, "--forcerun", "account", "--allowed-rules", "account", *args)
    verdict = json.loads((cwd / public).read_text())
    assert verdict["dp_guarantee"] is False and len(verdict["reasons"]) == 1
    assert "train_teacher[public] trained without noise on another preparation" in verdict["reasons"][0]
