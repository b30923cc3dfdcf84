"""One privacy budget over every release of a dataset; the curator's record of everything spent."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import h5py
import numpy as np

import pytest

from dpsad.data.datafile import split_identity_digests
from dpsad.privacy.books.curator_record import LEFT_OUT_BUNDLED, REPLACED_HOME, CuratorRecord
from dpsad.privacy.books.image_digests import set_fingerprint
from dpsad.errors import PrivacyError
from dpsad.data.bundled_uses import BUNDLED_REASON, LEAVE_OUT_ENV
from dpsad.synthetic import load_synthetic
from dpsad.privacy.accounting import SGMComponent, Accountant
from dpsad.privacy.books.release_budget import compose_releases, unknown_cost_reasons
from dpsad.privacy.books.ledger import components_of, make_entry
from dpsad.privacy.books.spent_log import record_spending, spent_summary
from workflow_helpers import ROOT, forget_releases, snakemake

BUDGET = {"epsilon": 12.0, "delta": 1e-5, "accountant": "pld"}


def sgm(stage, sigma, batch=None):
    return make_entry(stage=stage, private=True, mechanism="sgm", sample_rate=0.01, noise_multiplier=sigma, steps=400,
                      clip_norm=1.0, noise_seed="secret", batch=batch)


def privacy(*entries, guarantee=True):
    return {"dp_guarantee": guarantee, "epsilon": 1.0 if guarantee else None, "delta": 1e-5, "components": list(entries)}


def test_a_shared_dp_teacher_is_counted_once_across_releases():
    teacher = sgm("train_teacher[dp]", 1.0)
    a, b = sgm("distill_student", 1.0), sgm("distill_student", 1.0)
    result = compose_releases("toy", [("a", privacy(teacher, a)), ("b", privacy(teacher, b))], budget=BUDGET,
                              num_private_records=1000)
    component = SGMComponent(1.0, 0.01, 400)
    assert result["epsilon"] == pytest.approx(Accountant("pld").epsilon([component] * 3, 1e-5))
    assert [e["uid"] for e in result["components"]] == [teacher["uid"], a["uid"], b["uid"]]


def test_two_students_with_their_own_batch_keys_stay_two_mechanisms():
    """Each run's student and discriminator share one key; two runs composed together must not be merged."""
    run_a = [sgm("distill_student", 1.2, "distill_student:a"), sgm("discriminator", 2.0, "distill_student:a")]
    run_b = [sgm("distill_student", 1.2, "distill_student:b"), sgm("discriminator", 2.0, "distill_student:b")]
    assert len(components_of(run_a + run_b)) == 2
    result = compose_releases("toy", [("a", privacy(*run_a)), ("b", privacy(*run_b))], budget=BUDGET,
                              num_private_records=1000)
    one = Accountant("pld").epsilon(components_of(run_a), 1e-5)
    assert result["epsilon"] > one * 1.2


def test_a_release_past_the_budget_is_refused_naming_the_run_the_budget_and_the_total():
    runs = [(f"run{i}", privacy(sgm("distill_student", 0.7))) for i in range(4)]
    alone = Accountant("pld").epsilon(components_of(runs[0][1]["components"]), 1e-5)
    with pytest.raises(PrivacyError) as err:
        compose_releases("toy", runs, budget={**BUDGET, "epsilon": alone * 1.05}, num_private_records=1000)
    message = str(err.value)
    assert "\n" not in message and "'run1'" in message and f"epsilon {alone * 1.05:g}" in message
    total = float(message.split("to epsilon ")[1].split(" ")[0])
    assert total > alone * 1.05


def test_a_run_without_a_guarantee_releases_nothing_and_adds_nothing():
    result = compose_releases("toy", [("np", privacy(make_entry(stage="train_teacher", private=True, mechanism="none"),
                                                     guarantee=False))], budget=BUDGET, num_private_records=1000)
    assert result["epsilon"] == 0.0 and result["runs"][0]["released"] is False


def test_a_budget_delta_not_below_one_over_n_is_refused():
    with pytest.raises(PrivacyError, match="not below 1/n"):
        compose_releases("toy", [], budget={**BUDGET, "delta": 0.05}, num_private_records=50)


def test_the_spending_log_keeps_every_use_once_and_survives_reruns(tmp_path):
    teacher = sgm("train_teacher[dp]", 1.0)
    record_spending(tmp_path, [teacher, make_entry(stage="train_teacher[public]", private=False, mechanism="none")],
                    source="first")
    assert record_spending(tmp_path, [teacher, sgm("distill_student", 1.0)], source="second") == 1
    record_spending(tmp_path, [sgm("distill_student", 1.0)], source="rerun")  # a rerun: a new use, new uid
    record_spending(tmp_path, [make_entry(stage="train_teacher[private]", private=True, mechanism="none")], source="np")
    hand_written = {key: value for key, value in sgm("hand_written", 1.0).items() if key != "uid"}
    for source in ("hand", "hand again"):  # without a uid nothing tells the same use again: each counts
        assert record_spending(tmp_path, [dict(hand_written)], source=source) == 1
    summary = spent_summary(tmp_path, delta=1e-5)
    assert summary["dp_uses"] == 5
    assert summary["epsilon_of_dp_uses"] == pytest.approx(Accountant("pld").epsilon([SGMComponent(1.0, 0.01, 400)] * 5, 1e-5))
    assert summary["uses_without_a_guarantee"] == ["train_teacher[private]"]


def listing(folder):
    return sorted(p.name for p in folder.iterdir() if p.name != ".snakemake_timestamp")


def test_the_tiny_run_states_the_composed_total_of_its_releases(tiny_run):
    release = tiny_run / "release" / "mnist5k"
    budget = json.loads((release / "BUDGET.json").read_text())
    listed = ["public", "nonprivate", "dpsad_eps1", "dpsad_eps10", "dpsad_kmeans_eps10", "dpdm_eps10", "dpgan_eps10",
              "pe_eps1"]
    assert [row["run"] for row in budget["runs"]] == listed
    assert [row["released"] for row in budget["runs"]] == [True, False, True, True, True, True, True, True]
    # independently: the union of the released runs' components, by uid, composed with the same accountant
    by_uid = {}
    for run in listed[2:]:
        for entry in json.loads((tiny_run / "results" / "mnist5k" / run / "privacy.json").read_text())["components"]:
            by_uid[entry["uid"]] = entry
    expected = Accountant("pld").epsilon(components_of(list(by_uid.values())), 1e-5)
    assert budget["epsilon"] == pytest.approx(expected) and 10.0 < budget["epsilon"] <= 40.0
    for run in listed[2:]:
        released = json.loads((release / run / "privacy.json").read_text())
        assert released["epsilon"] <= 10.0 and "this release alone" in released["epsilon_scope"]
        assert released["dataset_total_at_release"]["epsilon"] == budget["epsilon_with_declared_earlier_use"]
        # tests/data/tiny.yaml declares a DP use of known cost: every release states it, and the total counts it
        declared = released["declared_earlier_use"]
        assert "with the Laplace mechanism" in declared["description"] and declared["epsilon"] == 1.0
        notes = load_synthetic(release / run / "synthetic.h5").attrs["guarantee_notes"]
        assert "declares an earlier use of these records" in notes and "adds to the epsilon above" in notes
        # the suite's two test settings, in every statement a recipient gets, the total's and the guarantee's
        settings = [REPLACED_HOME, LEFT_OUT_BUNDLED]
        assert released["dataset_total_at_release"]["test_settings"] == released["test_settings"] == settings
        assert all(sentence in notes for sentence in settings) and all(s in budget["statement"] for s in settings)
    for text in ("README.md", "NOT_RELEASED.txt"):  # a run without a guarantee says them beside its reasons
        assert all(s in (release / "nonprivate" / text).read_text() for s in (REPLACED_HOME, LEFT_OUT_BUNDLED))
    assert budget["epsilon_with_declared_earlier_use"] == pytest.approx(budget["epsilon"] + 1.0)
    assert budget["delta_with_declared_earlier_use"] == pytest.approx(1e-5)
    assert listing(release) == sorted(listed + ["BUDGET.json"])  # the history stays with the curator
    curator = CuratorRecord(tiny_run / ".test-home" / ".local" / "share" / "dpsad")  # the workspace's own (record_env)
    with curator.transaction():
        found, head = curator.rows("release"), curator.head()
        declared = [row.body["declared"]["description"] for row in curator.rows("declared")]
    rows = [row.body for row in found]
    assert len(declared) == 1 and "with the Laplace mechanism" in declared[0]  # the declared use, kept with the records
    assert [row["run"] for row in rows] == [run for run in listed if run != "nonprivate"]
    # BUDGET.json and each release name the record that composed them, where it stood, and the release's own row
    shown = "~/.local/share/dpsad/curator.sqlite"  # under the workspace's stand-in for the user's home, as ~
    assert budget["curator_record"] == {"history": head.history, "sequence": head.sequence, "head": head.digest,
                                        "location": shown}
    sequences = [row.get("curator_sequence") for row in budget["runs"]]
    assert sequences == [2, None, 3, 4, 5, 6, 7, 8] == [found[0].sequence, None, *(r.sequence for r in found[1:])]
    assert head.sequence == 8
    for run, sequence in zip(listed, sequences):
        if sequence:
            record = json.loads((release / run / "privacy.json").read_text())["dataset_total_at_release"]["curator_record"]
            assert record == {**budget["curator_record"], "release_sequence": sequence}
            assert f"curator's record at `{shown}`" in (release / run / "README.md").read_text()
    assert {row["private_records"] for row in rows} == {
        set_fingerprint(split_identity_digests(tiny_run / "results" / "mnist5k" / "data.h5", "private"))}
    logged = {entry["uid"] for row in rows for entry in row["entries"]}
    assert logged == {uid for uid, entry in by_uid.items() if entry["private"]}
    spent = json.loads((tiny_run / "results" / "mnist5k" / "spent.json").read_text())
    assert spent["epsilon_of_dp_uses"] >= budget["epsilon"] - 1e-9
    assert "train_teacher[private]" in spent["uses_without_a_guarantee"]


def test_the_default_configuration_releases_what_fits_its_budget(tmp_path):
    """The demo's list, fixed in config/config.yaml, holds the public row and one run at epsilon 10; its settings
    were chosen on its private records, which it declares as a use of unknown cost, so account states no guarantee."""
    import yaml

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    section = config["data"]["mnist5k"]
    targets = {run["name"]: run.get("target_epsilon", 0.0) for run in config["runs"]}
    assert section["privacy_budget"]["epsilon"] >= sum(targets[name] for name in section["release"])
    assert "chosen" in section["earlier_use"]["description"] and section["earlier_use"].get("epsilon") is None
    assert unknown_cost_reasons(section["earlier_use"], "mnist5k")


def copy_of(tiny_run, tmp_path_factory, *, forget_history: bool):
    cwd = tmp_path_factory.mktemp("budget") / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)
    subprocess.run(["chmod", "-R", "u+w", str(cwd / "release")], check=True)
    shutil.rmtree(cwd / "release")
    if forget_history:  # a curator who never released these records
        forget_releases(cwd)
    return cwd


@pytest.fixture(scope="module")
def copy_without_releases(tiny_run, tmp_path_factory):
    return copy_of(tiny_run, tmp_path_factory, forget_history=True)


@pytest.mark.e2e
def test_deleting_the_release_folder_does_not_reset_the_budget(tiny_run, tmp_path_factory, monkeypatch):
    """The tiny run released seven runs' worth (epsilon > 12); with release/ deleted, a budget of 12 refuses.  Then a
    folder made again from a shell without the bundled-use setting, beside files made with it, is refused."""
    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=False)
    before = json.loads((tiny_run / "release" / "mnist5k" / "BUDGET.json").read_text())["epsilon"]
    overlay = cwd / "small.yaml"
    overlay.write_text("data:\n  mnist5k:\n    privacy_budget: {epsilon: 12.0, delta: 1.0e-5}\n    release: [dpsad_eps1]\n")
    result = snakemake(cwd, "release", "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                       str(overlay), check=False)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    print(errors)
    assert result.returncode != 0 and len(errors) == 1
    assert errors[0].startswith("error: the releases already made from mnist5k's private records total epsilon ")
    # with tests/data/tiny.yaml's declared use of epsilon 1
    assert float(errors[0].split("total epsilon ")[1].split(" ")[0]) == pytest.approx(before + 1.0, rel=1e-3)
    assert not (cwd / "release" / "mnist5k" / "BUDGET.json").exists()
    # the same list as before rebuilds the same releases: the same uses, counted once
    result = snakemake(cwd, "release", "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml")
    again = json.loads((cwd / "release" / "mnist5k" / "BUDGET.json").read_text())
    check = json.loads((cwd / "results" / "mnist5k" / "release_check.json").read_text())  # the curator's, not released
    assert again["epsilon"] == pytest.approx(before) and "mnist5k/dpsad_eps10" in check["released_before"]
    assert "released_before" not in again and check["epsilon"] == pytest.approx(before)
    subprocess.run(["chmod", "-R", "u+w", str(cwd / "release")], check=True)
    shutil.rmtree(cwd / "release" / "mnist5k" / "dpsad_eps1")
    monkeypatch.setenv(LEAVE_OUT_ENV, "0")
    result = snakemake(cwd, "release", "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                       check=False)
    assert result.returncode != 0 and not (cwd / "release" / "mnist5k" / "dpsad_eps1").exists()
    assert re.search(r"error: \S*dpsad_eps1/privacy\.json was made under the test settings \[.+\], but this release "
                     r"runs under \[.+\], expected the same", result.stdout + result.stderr)


@pytest.mark.e2e
def test_a_budget_too_small_for_the_list_releases_nothing(copy_without_releases):
    cwd = copy_without_releases
    overlay = cwd / "small.yaml"
    overlay.write_text("data:\n  mnist5k:\n    privacy_budget: {epsilon: 12.0, delta: 1.0e-5}\n")
    result = snakemake(cwd, "release", "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                       str(overlay), check=False)
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: releasing run '")
    named = errors[0].split("'")[1]
    assert named in ("dpsad_eps10", "dpsad_kmeans_eps10", "dpdm_eps10", "dpgan_eps10")  # eps 1 + one eps 10 fit in 12
    total = float(errors[0].split("to epsilon ")[1].split(" ")[0])
    assert total > 12.0 and "privacy_budget epsilon 12;" in errors[0]
    assert not (cwd / "release" / "mnist5k").exists() or listing(cwd / "release" / "mnist5k") == []


@pytest.mark.e2e
def test_a_run_not_on_the_list_is_never_released(copy_without_releases):
    cwd = copy_without_releases
    overlay = cwd / "short.yaml"
    overlay.write_text("data:\n  mnist5k:\n    release: [public]\n")
    result = snakemake(cwd, "release/mnist5k/dpsad_eps10", "--cores", "1", "--configfile", "config/config.yaml",
                       "tests/data/tiny.yaml", str(overlay), check=False)
    assert result.returncode != 0
    assert "run 'dpsad_eps10' is not in data.mnist5k.release (public)" in result.stdout + result.stderr


@pytest.mark.e2e
def test_a_use_of_unknown_cost_makes_every_verdict_false_and_releases_only_the_reasons(tiny_run, tmp_path_factory):
    """The demo's own case: its settings were chosen on its private records.  Declared without a cost, the listed
    runs (the public row too) are accounted again with no guarantee, and their folders hold the reasons, no images."""
    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=True)
    (cwd / "unknown.yaml").write_text("data:\n  mnist5k:\n    release: [public, dpsad_eps1]\n    earlier_use:\n"
                                      "      {description: settings chosen on these records, epsilon: null, delta: null}\n")
    args = ("--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "unknown.yaml")
    # verdicts from before the declaration (params ignored, so account does not run again): refused, and the
    # declaration is kept in the curator's record it creates, which the job's log says
    stale = snakemake(cwd, "release", "--rerun-triggers", "mtime", *args, check=False)
    assert stale.returncode != 0 and "run 'public' states dp_guarantee true, but an earlier use of unknown cost" in (
        stale.stdout + stale.stderr)
    log = (cwd / "logs" / "mnist5k" / "release_budget.log").read_text()
    assert "created the curator's record" in log and "before the refusal below" in log
    snakemake(cwd, "release", *args)
    release = cwd / "release" / "mnist5k"
    for run in ("public", "dpsad_eps1"):
        privacy = json.loads((cwd / "results" / "mnist5k" / run / "privacy.json").read_text())
        assert privacy["dp_guarantee"] is False and privacy["epsilon"] is None
        assert privacy["reasons"][0].startswith("data.mnist5k.earlier_use declares a use of these records of unknown cost")
        assert listing(release / run) == ["NOT_RELEASED.txt", "README.md", "privacy.json"]
        assert "unknown cost" in (release / run / "NOT_RELEASED.txt").read_text()
    budget = json.loads((release / "BUDGET.json").read_text())
    assert [row["released"] for row in budget["runs"]] == [False, False]
    assert "settings chosen on these records; its cost is not known" in budget["statement"]


@pytest.mark.e2e
def test_a_verdict_from_before_a_use_of_unknown_cost_was_declared_is_not_released(tiny_run, tmp_path_factory):
    """With params ignored (``--rerun-triggers mtime``), neither account nor the budget runs again when such a use is
    declared after the budget recorded a run: building that run's folder is refused in one line."""
    cwd = tmp_path_factory.mktemp("declared_since") / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)
    subprocess.run(["chmod", "-R", "u+w", str(cwd / "release")], check=True)
    shutil.rmtree(cwd / "release" / "mnist5k" / "dpsad_eps1")
    (cwd / "unknown.yaml").write_text("data:\n  mnist5k:\n    earlier_use:\n"
                                      "      {description: settings chosen on these records, epsilon: null, delta: null}\n")
    result = snakemake(cwd, "release/mnist5k/dpsad_eps1", "--cores", "1", "--rerun-triggers", "mtime", "--configfile",
                       "config/config.yaml", "tests/data/tiny.yaml", "unknown.yaml", check=False)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert result.returncode != 0 and len(errors) == 1, result.stdout[-2000:]
    assert errors[0].endswith("privacy.json states dp_guarantee true beside a declared earlier use of unknown cost, "
                              "expected no guarantee (a verdict from before that use was declared, or of an older version "
                              "of dpsad): account it again, snakemake --forcerun account release")
    assert not (cwd / "release" / "mnist5k" / "dpsad_eps1").exists()


@pytest.mark.e2e
def test_a_run_listed_after_the_budget_was_checked_is_not_released_from_that_budget(tiny_run, tmp_path_factory):
    """With params ignored (``--rerun-triggers mtime``), BUDGET.json looks up to date when a run is added to the list:
    that run's release is refused (it was never checked against the budget nor recorded) until the budget is
    checked again, which records it."""
    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=True)
    args = ("--cores", "2", "--rerun-triggers", "mtime", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
            "list.yaml")
    for runs in ("dpsad_eps1", "dpsad_eps1, dpsad_eps10"):
        (cwd / "list.yaml").write_text(f"data:\n  mnist5k:\n    release: [{runs}]\n")
        result = snakemake(cwd, "release", *args, check=False)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert result.returncode != 0 and len(errors) == 1, result.stdout[-2000:]
    assert "BUDGET.json does not record run 'dpsad_eps10'" in errors[0]
    assert errors[0].endswith("--forcerun release/mnist5k/BUDGET.json")
    release = cwd / "release" / "mnist5k"
    assert sorted(p.name for p in release.iterdir()) == ["BUDGET.json", "dpsad_eps1"]
    snakemake(cwd, "release", *args, "--forcerun", "release/mnist5k/BUDGET.json")  # as the error says
    row = next(r for r in json.loads((release / "BUDGET.json").read_text())["runs"] if r["run"] == "dpsad_eps10")
    released = json.loads((release / "dpsad_eps10" / "privacy.json").read_text())
    assert row["trainings"] == sorted(c["uid"] for c in released["components"] if c["private"]) != []
    assert released["dataset_total_at_release"]["curator_record"]["release_sequence"] == row["curator_sequence"]


def test_a_release_needs_its_trainings_in_the_budget_and_its_guarantee_in_its_synthetic_file():
    from dpsad.errors import DpsadError
    from dpsad.release_folder import check_same_guarantee, release_row

    stated = privacy(sgm("distill_student", 1.0))
    trainings = [stated["components"][0]["uid"]]
    budget = {"curator_record": {"sequence": 3}, "runs": [{"run": "a", "curator_sequence": 3, "trainings": trainings}]}
    assert release_row(budget, "a", stated, "BUDGET.json") == {"sequence": 3, "release_sequence": 3}
    for row in ({"run": "b", "curator_sequence": 3, "trainings": trainings}, {"run": "a", "trainings": trainings},
                {"run": "a", "curator_sequence": 3}, {"run": "a", "curator_sequence": 3, "trainings": ["another"]}):
        with pytest.raises(PrivacyError, match="BUDGET.json does not record run 'a' with the trainings"):
            release_row({**budget, "runs": [row]}, "a", stated, "BUDGET.json")
    assert release_row({"runs": []}, "a", privacy(guarantee=False), "BUDGET.json")["release_sequence"] is None
    attrs = {"dp_guarantee": True, "epsilon": 1.0, "delta": 1e-5, "accountant": "pld", "trainings": json.dumps(trainings)}
    check_same_guarantee(attrs, "synthetic.h5", {**stated, "accountant": "pld"}, "privacy.json")
    for key, value in (("epsilon", 0.5), ("delta", 1e-6), ("accountant", "rdp"), ("dp_guarantee", False)):
        with pytest.raises(DpsadError, match="expected the same guarantee"):
            check_same_guarantee({**attrs, key: value}, "synthetic.h5", {**stated, "accountant": "pld"}, "privacy.json")
    # review: a run trained again at the same epsilon, its earlier samples kept (--touch), or a file of an earlier version
    for other in ({**attrs, "trainings": json.dumps(["an earlier training"])}, {k: v for k, v in attrs.items() if k != "trainings"}):
        with pytest.raises(DpsadError, match="expected the samples of this training: draw them again"):
            check_same_guarantee(other, "synthetic.h5", {**stated, "accountant": "pld"}, "privacy.json")
    check_same_guarantee({"dp_guarantee": False}, "synthetic.h5", privacy(guarantee=False), "privacy.json")


def test_a_public_runs_samples_kept_past_a_new_public_teacher_are_refused(tmp_path):
    """A ``public`` run composes no private training, so its ``trainings`` ([]) match any: the samples of a teacher
    trained before another preparation, kept by --touch, are refused by the public trainings they state, and so is
    a file written before they were stated (not known: drawn again, at no privacy cost), unless the run composes no
    public training; one that states the same teacher passes."""
    from dpsad.errors import DpsadError
    from dpsad.release_folder import check_same_guarantee
    from dpsad.synthetic import write_synthetic

    def public_teacher():
        return make_entry(stage="train_teacher[public]", private=False, mechanism="none", steps=8)

    kept, retrained = public_teacher(), public_teacher()
    stated = {**privacy(kept), "accountant": "pld"}
    write_synthetic(tmp_path / "synthetic.h5", np.zeros((2, 8, 8, 1), np.uint8), None, dataset="toy", method="public",
                    run="public", privacy=stated, class_names=[], config_sha256="0", code_version="0")
    with h5py.File(tmp_path / "synthetic.h5") as handle:
        attrs = dict(handle.attrs)
    assert json.loads(attrs["public_trainings"]) == [kept["uid"]] and json.loads(attrs["trainings"]) == []
    check_same_guarantee(attrs, "synthetic.h5", stated, "privacy.json")
    with pytest.raises(DpsadError, match=r"public trainings \['%s'\].*draw them again" % kept["uid"]):
        check_same_guarantee(attrs, "synthetic.h5", {**privacy(retrained), "accountant": "pld"}, "privacy.json")
    with pytest.raises(DpsadError, match="unreadable"):
        check_same_guarantee({**attrs, "public_trainings": "[no"}, "synthetic.h5", stated, "privacy.json")
    before = {k: v for k, v in attrs.items() if k != "public_trainings"}
    with pytest.raises(DpsadError, match=r"public trainings not stated \(an earlier version.*composes \[\] and \['%s'\]"
                       % kept["uid"]):
        check_same_guarantee(before, "synthetic.h5", stated, "privacy.json")
    check_same_guarantee(before, "synthetic.h5", {**privacy(), "accountant": "pld"}, "privacy.json")


def test_a_guarantee_beside_a_use_of_unknown_cost_or_over_a_shared_release_is_refused(tmp_path):
    """A verdict of an older version (true beside the run's own use of unknown cost), kept with a BUDGET.json that
    recorded it, is refused at release_run; a folder shared with a guarantee is not replaced by a false verdict."""
    from dpsad.privacy.books.release_budget import refuse_replacing_a_release
    from dpsad.release_folder import check_no_guarantee_beside_a_use_of_unknown_cost as check

    stated = privacy(sgm("distill_student", 1.0))
    unknown = {"description": "tuned on them", "epsilon": None, "delta": None}
    with pytest.raises(PrivacyError, match=r"^privacy.json states dp_guarantee true beside a declared earlier use of "
                                           r"unknown cost, .* snakemake --forcerun account release$"):
        check({**stated, "declared_earlier_use": unknown}, "privacy.json")
    check({**stated, "declared_earlier_use": {**unknown, "epsilon": 1.0, "delta": 0.0}}, "privacy.json")
    check({**privacy(guarantee=False), "declared_earlier_use": unknown}, "privacy.json")
    check(stated, "privacy.json")
    with pytest.raises(PrivacyError, match="states dp_guarantee true beside a declared earlier use of unknown cost"):
        check(stated, "privacy.json", unknown)  # declared since it was accounted, its verdict kept (mtime triggers)
    check(stated, "privacy.json", {**unknown, "epsilon": 1.0, "delta": 0.0})
    folder = tmp_path / "release" / "toy" / "a"
    folder.mkdir(parents=True)
    (folder / "privacy.json").write_text(json.dumps(stated))
    false = {**privacy(guarantee=False), "reasons": ["data.toy.earlier_use declares a use of unknown cost"]}
    refuse_replacing_a_release(folder.parent, [("a", false)])  # no synthetic.h5: the reasons of a run never released
    (folder / "synthetic.h5").write_bytes(b"")
    with pytest.raises(PrivacyError, match=r"holds a release with a DP guarantee that run 'a' no longer has "
                                           r"\(data.toy.earlier_use declares a use of unknown cost\)"):
        refuse_replacing_a_release(folder.parent, [("a", false)])


def test_a_release_list_needs_a_budget_and_names_configured_runs():
    from dpsad.config import load_config_file, released_runs
    from dpsad.errors import DpsadError

    with pytest.raises(DpsadError, match="data.mnist5k.release lists runs but data.mnist5k.privacy_budget is not set"):
        load_config_file(ROOT / "config" / "config.yaml", {"data": {"mnist5k": {"privacy_budget": None}}})
    config = load_config_file(ROOT / "config" / "config.yaml", {"data": {"mnist5k": {"release": ["public", "ghost"]}}})
    with pytest.raises(DpsadError, match="data.mnist5k.release lists 'ghost', expected one of the runs"):
        released_runs(config, "mnist5k")
    assert released_runs(load_config_file(ROOT / "config" / "config.yaml"), "mnist5k") == ["public", "dpsad_eps10"]


def test_every_release_folder_has_a_card_stating_what_its_files_state(tiny_run):
    """README.md, for a recipient who gets one folder: its figures are privacy.json's, BUDGET.json's and the
    synthetic data's own, its scope names what is not covered, and a false verdict's card releases nothing."""
    from dpsad.privacy.books.image_digests import NOT_DETECTED
    from dpsad.privacy.stated import rounded_up

    release = tiny_run / "release" / "mnist5k"
    budget = json.loads((release / "BUDGET.json").read_text())
    folders = sorted(p for p in release.iterdir() if p.is_dir())
    assert len(folders) == 8
    for folder in folders:
        card = (folder / "README.md").read_text()
        privacy = json.loads((folder / "privacy.json").read_text())
        if not privacy["dp_guarantee"]:
            assert card.startswith(f"# mnist5k / {folder.name}: not released (no DP guarantee)\n")
            assert "**no differential privacy guarantee**" in card and privacy["reasons"][0] in card
            assert "synthetic.h5`:" not in card and not (folder / "synthetic.h5").exists()
            continue
        print(card)
        assert f"**({rounded_up(privacy['epsilon'], 6)}, {rounded_up(privacy['delta'], 6)})-differentially private**" in card
        assert f"the {privacy['num_private_records']} records of the private training split" in card
        total = privacy["dataset_total_at_release"]
        stated = (budget["epsilon_with_declared_earlier_use"], budget["delta_with_declared_earlier_use"])
        assert (total["epsilon"], total["delta"]) == stated  # the releases and tests/data/tiny.yaml's declared use
        assert f"**({rounded_up(stated[0], 6)}, {rounded_up(stated[1], 6)})-DP**" in card
        synthetic = load_synthetic(folder / "synthetic.h5")
        assert f"**{len(synthetic.images)}** images of 16 x 16 pixels, 1 channel(s)" in card
        counts = {name: int((synthetic.labels == k).sum()) for k, name in enumerate(synthetic.class_names)}
        assert all(f"| {name} | {count} |" in card for name, count in counts.items())
        assert NOT_DETECTED in card and "with the Laplace mechanism. Its cost (epsilon 1, delta 0) is included" in card
        assert "(samples.png)" in card and (folder / "samples.png").stat().st_size > 0
        assert 'f["images"][()]' in card


def test_a_public_run_warm_started_from_a_teacher_that_read_private_records_does_not_say_it_read_none():
    """Review: ``teachers.public.init`` may name a ``split: central`` teacher; its card said "no private record read"."""
    from dpsad.card import METHOD_NAMES, method_kind

    public = make_entry(stage="train_teacher[public]", private=False, mechanism="none")
    central = make_entry(stage="central_images", private=True, mechanism="gaussian", sample_rate=1.0,
                         noise_multiplier=5.0, steps=1, clip_norm=1.0, noise_seed="secret")
    assert method_kind("public", {"components": [public]}) == "public"
    kind = method_kind("public", {"components": [public, central]})
    assert "no private record read" not in METHOD_NAMES[kind] and "under DP" in METHOD_NAMES[kind]


@pytest.mark.e2e
def test_a_budget_waits_for_the_records_of_every_other_dataset_that_declares_a_use(tmp_path):
    """The demo's records under a second name that declares nothing: its budget reads the demo's data.h5, whose
    declared use of unknown cost it keeps and counts (tests/test_records_budget.py), whichever budget runs first."""
    from workflow_helpers import workdir

    cwd = workdir(tmp_path)
    (cwd / "again.yaml").write_text(
        "datasets: [mnist5k, again]\ndata:\n  again: {source: mnist5k, public: {source: font_digits, n_per_class: 2},"
        " privacy_budget: {epsilon: 10.0, delta: 1.0e-5}, release: [public]}\n")
    result = snakemake(cwd, "release/again/BUDGET.json", "release/mnist5k/BUDGET.json", "-n", "--cores", "1",
                       "--configfile", "config/config.yaml", "again.yaml")
    inputs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", result.stdout + result.stderr):
        if block.startswith(("rule release_budget:", "localrule release_budget:")):
            (line,) = [row for row in block.splitlines() if row.strip().startswith("input: ")]
            (output,) = [row for row in block.splitlines() if row.strip().startswith("output: ")]
            inputs[output.split("release/")[1].split("/")[0]] = line.strip()[len("input: "):].split(", ")
    assert "results/mnist5k/data.h5" in inputs["again"]  # the demo declares a use: waited for and read
    assert "results/again/data.h5" not in inputs["mnist5k"]  # "again" declares none


@pytest.mark.e2e
def test_another_datasets_use_counts_first_and_a_budget_from_before_it_changed_releases_nothing(tiny_run,
                                                                                                 tmp_path_factory):
    """The tiny run's records again under the name "again", which declares nothing: its budget, run before the
    tiny run's own, counts the stand-in use mnist5k declares.  That declaration changed, with params ignored
    (``--rerun-triggers mtime``) the budget is not composed again: the release built from it is refused in one line
    until it is."""
    import yaml
    from snakemake.utils import update_config

    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=True)
    merged = {}
    for path in ("config/config.yaml", "tests/data/tiny.yaml"):
        update_config(merged, yaml.safe_load((ROOT / path).read_text()))
    again = {**merged["data"]["mnist5k"], "release": ["public"], "earlier_use": None}
    overlay = {"datasets": ["mnist5k", "again"], "data": {"again": again}}
    (cwd / "again.yaml").write_text(yaml.safe_dump(overlay))
    args = ("--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "again.yaml")
    snakemake(cwd, "release/again/BUDGET.json", *args)
    budget = json.loads((cwd / "release" / "again" / "BUDGET.json").read_text())
    (use,) = budget["declared_earlier_uses"]
    assert use["declared_by"] == ["mnist5k"] and use["epsilon"] == 1.0
    assert budget["composed_with_uses"] == {"mnist5k": {key: use[key] for key in ("description", "epsilon", "delta")}}
    assert budget["epsilon_with_declared_earlier_use"] == pytest.approx(budget["epsilon"] + 1.0)
    assert not (cwd / "release" / "mnist5k").exists()  # the tiny run's own budget never ran

    overlay["data"]["mnist5k"] = {"earlier_use": {**merged["data"]["mnist5k"]["earlier_use"], "epsilon": 2.0}}
    (cwd / "again.yaml").write_text(yaml.safe_dump(overlay))
    result = snakemake(cwd, "release/again/public", "--rerun-triggers", "mtime", *args, check=False)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert result.returncode != 0 and len(errors) == 1, (result.stdout + result.stderr)[-3000:]
    assert "BUDGET.json was composed before the earlier use now declared in data.mnist5k.earlier_use" in errors[0]
    assert not (cwd / "release" / "again" / "public").exists()
    assert "compose it again (snakemake --forcerun release/again/BUDGET.json), then run again" in errors[0]
    snakemake(cwd, "release/again/BUDGET.json", "--rerun-triggers", "mtime", "--forcerun", "release/again/BUDGET.json",
              *args)
    snakemake(cwd, "release/again/public", "--rerun-triggers", "mtime", *args)
    assert (cwd / "release" / "again" / "public" / "privacy.json").exists()


def test_a_release_is_refused_while_the_curators_record_holds_a_use_its_budget_left_out(tiny_run, tmp_path):
    """build_release, as the release job calls it, from the tiny run's files: a use of its records declared after
    its BUDGET.json was composed (under another name, in another workspace's record) stops the release of a run with
    a guarantee, and of one without, whose folder copies the total, also where that budget states no bounded total
    for a use of unknown cost of other records (as the demo's, listed in the budget).  A use the budget counted, of
    unknown cost, stops only the run with a guarantee, and the folder of the other says there is no bounded total,
    from a budget of an earlier version too (which lists that use without the sentence).  A run with a guarantee is
    compared with the uses the curator's check capped these records with, not with every record's."""
    from dpsad.errors import DpsadError
    from dpsad.release_folder import build_release, release_budget
    from dpsad.training.checkpoints import load_checkpoint

    results, data = tiny_run / "results" / "mnist5k", tiny_run / "results" / "mnist5k" / "data.h5"
    budget = json.loads((tiny_run / "release" / "mnist5k" / "BUDGET.json").read_text())
    stand_in = budget["composed_with_uses"]
    later = {"description": "released again elsewhere", "epsilon": 1.0, "delta": 0.0}
    release_budget(tmp_path / "elsewhere" / "BUDGET.json", dataset="again", data_path=data, listed=[],
                   budget={"epsilon": 40.0, "delta": 1e-5, "accountant": "pld"}, curator_dir=tmp_path / "c",
                   declared=later)
    generators = {"dpsad_eps1": results / "dpsad_eps1" / "student.pt", "nonprivate": results / "teacher" / "private.pt",
                  "public": results / "teacher" / "public.pt"}

    def release(run, stated, check_path=results / "release_check.json", data_path=data, folder=None,
                configured_budget=budget["budget"]):
        (tmp_path / "BUDGET.json").write_text(json.dumps(stated))
        generator = generators[run]
        return build_release(tmp_path / "release" / (folder or run), synthetic_path=results / run / "synthetic.h5",
                             privacy_path=results / run / "privacy.json", checkpoint=load_checkpoint(generator),
                             checkpoint_path=generator, ledger_path=generator.with_suffix(".ledger.json"),
                             include_generator=False, budget_path=tmp_path / "BUDGET.json",
                             configured_budget=configured_budget, configured_use=stand_in["mnist5k"], configured_uses=stand_in,
                             dataset="mnist5k", data_path=data_path, curator_dir=tmp_path / "c", workspace=tmp_path,
                             check_path=check_path)

    demo = {"description": "the demo's settings, chosen on other records", "epsilon": None, "delta": None,
            "declared_by": ["mnist5k"]}
    unbounded_elsewhere = {**budget, "no_bounded_total": "No total bounds every use of the records the curator holds.",
                           "declared_earlier_uses": budget["declared_earlier_uses"] + [demo]}
    assert "no_bounded_total" not in budget
    for stated in (budget, unbounded_elsewhere):
        for run in ("dpsad_eps1", "nonprivate"):
            with pytest.raises(PrivacyError, match=r"BUDGET.json was composed before the curator's record held the "
                                                   r"earlier use 'released again elsewhere' of these records \(declared "
                                                   r"by again\), or that use has no known cost, expected a budget"):
                release(run, stated)
            assert not (tmp_path / "release" / run).exists()
    # the same declaration counted for other records: the stated total counts it, but the check capped these records
    # without it (the curator's check, written with the budget, lists the uses of these records only)
    listed_for_others = {**budget, "declared_earlier_uses": budget["declared_earlier_uses"] + [
        {**later, "declared_by": ["far"]}]}
    with pytest.raises(PrivacyError, match="'released again elsewhere' of these records"):
        release("dpsad_eps1", listed_for_others)
    assert release("nonprivate", listed_for_others) == ["NOT_RELEASED.txt", "README.md", "privacy.json"]
    shutil.rmtree(tmp_path / "release" / "nonprivate")
    with pytest.raises(DpsadError, match="missing.json: not a readable curator's release check"):
        release("dpsad_eps1", listed_for_others, check_path=tmp_path / "missing.json")
    check = json.loads((results / "release_check.json").read_text())
    (tmp_path / "counted.json").write_text(json.dumps({**check, "declared_earlier_uses": check["declared_earlier_uses"] + [
        {**later, "declared_by": ["again"]}]}))
    assert "synthetic.h5" in release("dpsad_eps1", listed_for_others, check_path=tmp_path / "counted.json")
    shutil.rmtree(tmp_path / "release" / "dpsad_eps1")
    # the same records prepared again (splits as the check names them) after trainings on another preparation, all
    # kept by --touch: refused as the budget refuses them, the public run (no private training) by its teacher
    shutil.copyfile(data, tmp_path / "again.h5")
    with h5py.File(tmp_path / "again.h5", "a") as handle:
        handle.attrs["records_id"] = "another preparation"
    for run, why in (("dpsad_eps1", "another preparation"), ("public", "trained without noise on another preparation")):
        with pytest.raises(PrivacyError, match=f"run '{run}': .*{why}"):
            release(run, listed_for_others, check_path=tmp_path / "counted.json", data_path=tmp_path / "again.h5")
        assert not (tmp_path / "release" / run).exists()
    assert "synthetic.h5" in release("public", listed_for_others, check_path=tmp_path / "counted.json")
    shutil.rmtree(tmp_path / "release" / "public")
    # a budget kept (--rerun-triggers mtime) after the configured cap changed; samples under another run's name
    lowered = {**budget["budget"], "epsilon": 5.0}
    with pytest.raises(PrivacyError, match=r"BUDGET.json was composed under the budget .*'epsilon': 40.0.*"
                                           r"data.mnist5k.privacy_budget is .*'epsilon': 5.0.*run the same snakemake "
                                           r"command again with --forcerun .*BUDGET.json$"):
        release("public", listed_for_others, check_path=tmp_path / "counted.json", configured_budget=lowered)
    with pytest.raises(DpsadError, match=r"states dataset and run \('mnist5k', 'public'\), expected \('mnist5k', "
                                         r"'renamed'\): draw them again"):
        release("public", listed_for_others, check_path=tmp_path / "counted.json", folder="renamed")
    assert not any((tmp_path / "release" / name).exists() for name in ("public", "renamed"))
    (tmp_path / "other.json").write_text(json.dumps({**check, "curator_record": {**check["curator_record"], "sequence": 1}}))
    with pytest.raises(PrivacyError, match="other.json is not the check .*BUDGET.json was composed with"):
        release("dpsad_eps1", listed_for_others, check_path=tmp_path / "other.json")
    unknown = {**later, "epsilon": None, "delta": None}
    release_budget(tmp_path / "elsewhere" / "BUDGET.json", dataset="again", data_path=data, listed=[],
                   budget={"epsilon": 40.0, "delta": 1e-5, "accountant": "pld"}, curator_dir=tmp_path / "c",
                   declared=unknown)
    counted = {**unbounded_elsewhere, "declared_earlier_uses": unbounded_elsewhere["declared_earlier_uses"] + [
        {**later, "declared_by": ["again"]}, {**unknown, "declared_by": ["again"]}]}
    with pytest.raises(PrivacyError, match="'released again elsewhere' of these records"):
        release("dpsad_eps1", counted)
    assert release("nonprivate", counted) == ["NOT_RELEASED.txt", "README.md", "privacy.json"]
    total = json.loads((tmp_path / "release" / "nonprivate" / "privacy.json").read_text())["dataset_total_at_release"]
    assert total["no_bounded_total"] == counted["no_bounded_total"] and total["epsilon"] == budget["epsilon_with_declared_earlier_use"]
    shutil.rmtree(tmp_path / "release" / "nonprivate")
    earlier_version = {key: value for key, value in counted.items() if key != "no_bounded_total"}
    assert release("nonprivate", earlier_version) == ["NOT_RELEASED.txt", "README.md", "privacy.json"]
    total = json.loads((tmp_path / "release" / "nonprivate" / "privacy.json").read_text())["dataset_total_at_release"]
    assert total["no_bounded_total"].startswith("No total bounds every use of the records the curator holds")


@pytest.mark.e2e
def test_without_the_test_setting_the_tiny_runs_digits_release_no_guarantee(tiny_run, tmp_path_factory, monkeypatch):
    """The tiny run's private records are bundled MNIST-5k digits, on which dpsad's defaults were chosen: with that
    use in (the suite leaves it out, dpsad.data.bundled_uses), the budget refuses the verdicts made under the setting
    before it records anything, and the account stage, run again, states no guarantee and why."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=True)
    (cwd / "list.yaml").write_text("data:\n  mnist5k:\n    release: [dpsad_eps1]\n")
    args = ("--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "list.yaml")
    stale = snakemake(cwd, "release", *args, check=False)
    assert stale.returncode != 0 and re.search(
        r"error: \S*dpsad_eps1/privacy\.json was made under the test settings \[.+\], but this release runs under "
        r"\[.+\], expected the same: .+ \(the same snakemake command again, with --forcerun "
        r"results/mnist5k/dpsad_eps1/privacy\.json\)",
        stale.stdout + stale.stderr)
    assert not (cwd / ".test-home" / ".local" / "share" / "dpsad" / "curator.sqlite").exists()  # nothing recorded
    snakemake(cwd, "release", *args, "--forcerun", "results/mnist5k/dpsad_eps1/privacy.json")
    privacy = json.loads((cwd / "results" / "mnist5k" / "dpsad_eps1" / "privacy.json").read_text())
    assert privacy["dp_guarantee"] is False and BUNDLED_REASON in privacy["reasons"]
    assert not re.search(r"\d+ of (the|its) private records", json.dumps(privacy))  # the number stays in the log
    assert listing(cwd / "release" / "mnist5k" / "dpsad_eps1") == ["NOT_RELEASED.txt", "README.md", "privacy.json"]
    budget = json.loads((cwd / "release" / "mnist5k" / "BUDGET.json").read_text())
    assert "chosen by the developers of dpsad" in budget["statement"] and LEFT_OUT_BUNDLED not in budget["statement"]
    # made again under the one setting left, every statement names it alone (the release checks they agree)
    released = json.loads((cwd / "release" / "mnist5k" / "dpsad_eps1" / "privacy.json").read_text())
    assert released["test_settings"] == released["dataset_total_at_release"]["test_settings"] == [REPLACED_HOME]
    assert budget["test_settings"] == [REPLACED_HOME]
