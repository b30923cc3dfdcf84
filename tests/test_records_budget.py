"""A budget belongs to the private records: their digests, the curator's release record, declared earlier uses."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch

from conftest import indexed_images
from dpsad.data.datafile import prepare, read_attrs, split_digest_kinds, split_record_digests
from dpsad.privacy.books.image_digests import RecordSets, record_digests, records_among, set_fingerprint
from dpsad.errors import DpsadError, PrivacyError
from dpsad.privacy.accounting import Accountant
from dpsad.privacy.books.ledger import components_of, make_entry
from dpsad.privacy.books.curator_record import CuratorRecord
from dpsad.privacy.books.release_budget import public_budget, unknown_cost_reasons
from dpsad import release_folder
from dpsad.privacy.books.preparation import stamped
from dpsad.jobs.stage import inputs_sha256
from dpsad.training.training_loop import resume_state, save_checkpoint

BUDGET = {"epsilon": 10.0, "delta": 1e-5, "accountant": "pld"}


def dp_run(sigma=0.6):
    """A run's privacy.json with one student entry of its own (new uid: a new training)."""
    entry = make_entry(stage="distill_student", private=True, mechanism="sgm", sample_rate=0.02, noise_multiplier=sigma,
                       steps=300, clip_norm=1.0, noise_seed="secret")
    return {"dp_guarantee": True, "epsilon": Accountant("pld").epsilon(components_of([entry]), 1e-5), "delta": 1e-5,
            "components": [entry]}


def release_budget(budget_path, *, data_path, listed=(), **options) -> dict:
    """dpsad's release_budget of ``listed`` runs trained on ``data_path``'s preparation: their private entries name
    it, as the trainings on it stamp them (in place)."""
    attrs = read_attrs(data_path)
    for _, privacy in listed:
        stamped(privacy.get("components", []), attrs)
    return release_folder.release_budget(budget_path, data_path=data_path, listed=listed, **options)


def public_run():
    return {"dp_guarantee": True, "epsilon": 0.0, "delta": 1e-5,
            "components": [make_entry(stage="train_teacher[public]", private=False, mechanism="none")]}


def settings(npz, **overrides):
    return {"source": "npz", "path": str(npz), "test_fraction": 0.2, "public_fraction": 0.1, "private_fraction": 0.9,
            "seed": 0, **overrides}


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "records.npz"
    np.savez(path, images=indexed_images(400), labels=np.arange(400) % 4)
    return path


def test_a_record_set_has_one_fingerprint_in_any_order_and_each_record_counts():
    images = indexed_images(50)
    digests = record_digests(images)
    assert digests.shape == (50, 16) and digests.dtype == np.uint8 and len({bytes(d) for d in digests}) == 50
    assert set_fingerprint(record_digests(images[::-1])) == set_fingerprint(digests)
    assert (record_digests(images[10:20]) == digests[10:20]).all()  # a record's digest is its own, not its position's
    changed = images.copy()
    changed[7, 5, 5, 0] ^= 1
    assert set_fingerprint(record_digests(changed)) != set_fingerprint(digests)
    assert set_fingerprint(record_digests(images[:-1])) != set_fingerprint(digests)
    # the same pixels at another shape are another record
    assert bytes(record_digests(images[:1].reshape(1, 14, 56, 1))[0]) != bytes(digests[0])


def test_prepare_data_stores_the_digests_and_the_set_fingerprints(tmp_path, npz):
    out = tmp_path / "data.h5"
    splits = prepare(settings(npz), "toy", out)
    attrs = read_attrs(out)
    private = split_record_digests(out, "private")
    assert (private == record_digests(splits["train"].images)).all()
    assert attrs["private_records_sha256"] == set_fingerprint(private)
    assert attrs["public_records_sha256"] == set_fingerprint(split_record_digests(out, "public"))
    renamed = tmp_path / "renamed.h5"
    prepare(settings(npz), "another_name", renamed)
    assert read_attrs(renamed)["private_records_sha256"] == attrs["private_records_sha256"]


def test_two_dataset_names_over_the_same_records_share_one_budget(tmp_path, npz):
    curator = tmp_path / "curator"
    for name in ("toy", "toy_copy"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    first = release_budget(tmp_path / "release" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                           listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    assert 5.0 < first["epsilon"] <= 10.0
    with pytest.raises(PrivacyError) as err:
        release_budget(tmp_path / "release" / "toy_copy" / "BUDGET.json", dataset="toy_copy",
                       data_path=tmp_path / "toy_copy.h5", listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    message = str(err.value)
    print(message)
    assert "\n" not in message and "toy_copy's private records (released before as toy: the same records)" in message
    assert float(message.split("to epsilon ")[1].split(" ")[0]) > 10.0
    # with room for both, the copy's budget states the composed total and where the records were released before
    roomy = release_budget(tmp_path / "release" / "toy_copy" / "BUDGET.json", dataset="toy_copy",
                           data_path=tmp_path / "toy_copy.h5", listed=[("dp", dp_run())],
                           budget={**BUDGET, "epsilon": 30.0}, curator_dir=curator)
    assert roomy["released_before"] == ["toy/dp"] and roomy["released_before_as"] == ["toy"]
    assert roomy["epsilon"] > first["epsilon"] * 1.2 and "(as toy)" in roomy["statement"]


def test_a_private_split_sharing_only_some_records_composes_too(tmp_path, npz):
    curator = tmp_path / "curator"
    splits = prepare(settings(npz), "toy", tmp_path / "toy.h5")
    release_budget(tmp_path / "r" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    subset = tmp_path / "subset.npz"  # 150 of toy's private records and nothing of its public split
    np.savez(subset, images=splits["train"].images[:150], labels=splits["train"].labels[:150])
    prepare(settings(subset, public_fraction=0.0, private_fraction=1.0), "subset", tmp_path / "subset.h5")
    with pytest.raises(PrivacyError, match="subset's private records \\(released before as toy: the same records\\)"):
        release_budget(tmp_path / "r" / "subset" / "BUDGET.json", dataset="subset", data_path=tmp_path / "subset.h5",
                       listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)


def test_every_budget_and_card_say_that_a_split_with_a_record_of_an_earlier_release_can_be_refused(tmp_path, npz):
    """Review: the check caps the releases that share a record with the split, so one record of an earlier release
    added to a split can turn its release into a refusal: whether a folder appears depends on the private records.
    Every BUDGET.json and card say which neighbouring splits the guarantee compares (the same text for all, so the
    text itself says nothing of the records)."""
    from dpsad.card import dataset_card
    from dpsad.privacy.books.release_budget import RELEASE_DECISION
    from dpsad.synthetic import SyntheticData

    curator = tmp_path / "curator"
    prepare(settings(npz), "toy", tmp_path / "toy.h5")
    release_budget(tmp_path / "r" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    toy_train = prepare(settings(npz), "again", tmp_path / "again.h5")["train"]
    other = tmp_path / "other.npz"  # records toy never held, and the same with one of toy's private records
    np.savez(other, images=indexed_images(199, seed=1), labels=np.arange(199) % 4)
    with_one = tmp_path / "with_one.npz"
    np.savez(with_one, images=np.concatenate([indexed_images(199, seed=1), toy_train.images[:1]]),
             labels=np.concatenate([np.arange(199) % 4, toy_train.labels[:1]]))
    for name, source in (("other", other), ("with_one", with_one)):
        prepare(settings(source, public_fraction=0.0, private_fraction=1.0), name, tmp_path / f"{name}.h5")
    with pytest.raises(PrivacyError, match="releasing run 'dp' would bring the total over the releases of with_one's"):
        release_budget(tmp_path / "r" / "with_one" / "BUDGET.json", dataset="with_one",
                       data_path=tmp_path / "with_one.h5", listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    checked = release_budget(tmp_path / "r" / "other" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                             listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    assert checked["released_before"] == []  # the one record more is all that refused with_one
    # an earlier use declared for toy is in other's stated total too, which does not say whose records it covered
    declared = {"description": "tuned on them", "epsilon": 0.5, "delta": 0.0}
    release_budget(tmp_path / "r2" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5", listed=[],
                   budget={**BUDGET, "epsilon": 40.0}, curator_dir=curator, declared=declared)
    shutil.rmtree(tmp_path / "r" / "other")
    release_budget(tmp_path / "r" / "other" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                   listed=[("dp", dp_run())], budget={**BUDGET, "epsilon": 40.0}, curator_dir=curator)
    statement = json.loads((tmp_path / "r" / "other" / "BUDGET.json").read_text())["statement"]
    assert "an earlier use of records the curator holds (these or others) outside this pipeline" in statement
    assert "an earlier use of these records" not in statement
    for name in ("toy", "other"):
        stated = json.loads((tmp_path / "r" / name / "BUDGET.json").read_text())
        assert stated["release_decision"] == RELEASE_DECISION and RELEASE_DECISION in stated["statement"]
    assert "adding one that an earlier release or declared use holds can turn a release into a refusal" in RELEASE_DECISION
    old_budget = {key: value for key, value in stated.items() if key != "release_decision"}  # written before this
    assert f"- {RELEASE_DECISION}" in dataset_card(dp_run(), old_budget, SyntheticData(
        np.zeros((4, 8, 8, 1), np.uint8), np.arange(4) % 4,
        {"dataset": "other", "run": "dp", "method": "dpsad", "class_names": json.dumps(list("abcd"))}),
        dataset="other", run="dp", samples=False)
    synthetic = SyntheticData(np.zeros((4, 8, 8, 1), np.uint8), np.arange(4) % 4,
                              {"dataset": "other", "run": "dp", "method": "dpsad", "class_names": json.dumps(list("abcd"))})
    card = dataset_card(dp_run(), stated, synthetic, dataset="other", run="dp", samples=False)
    assert f"- {RELEASE_DECISION}" in card


def test_deleting_the_release_folder_forgets_nothing(tmp_path, npz):
    curator = tmp_path / "curator"
    prepare(settings(npz), "toy", tmp_path / "toy.h5")
    release = tmp_path / "release" / "toy"
    first = release_budget(release / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                           listed=[("public", public_run()), ("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    with CuratorRecord(curator).transaction() as record:
        rows = [row.body for row in record.rows("release")]
    assert [r["run"] for r in rows] == ["public", "dp"] and rows[0]["entries"] == []
    shutil.rmtree(release)
    # the same release rebuilt (same uids) is counted once ...
    again = json.loads(json.dumps(first))
    same = release_budget(release / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                          listed=[("dp", {"dp_guarantee": True, "components": again["components"]})], budget=BUDGET,
                          curator_dir=curator)
    assert same["epsilon"] == pytest.approx(first["epsilon"])
    shutil.rmtree(release)
    # ... a retrained run (new uids) adds to what already left
    with pytest.raises(PrivacyError) as err:
        release_budget(release / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5", listed=[("dp", dp_run())],
                       budget=BUDGET, curator_dir=curator)
    print(err.value)
    assert str(err.value).startswith("releasing run 'dp' would bring the total") and "over data.toy.privacy_budget" in str(err.value)
    assert not (release / "BUDGET.json").exists()


def test_records_released_as_public_can_never_be_private(tmp_path, npz):
    curator = tmp_path / "curator"
    prepare(settings(npz), "toy", tmp_path / "toy.h5")
    release_budget(tmp_path / "r" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("public", public_run())], budget=BUDGET, curator_dir=curator)
    prepare(settings(npz, seed=3), "toy", tmp_path / "reseeded.h5")  # a new seed moves records across the line
    with pytest.raises(PrivacyError) as err:
        release_budget(tmp_path / "r" / "toy2" / "BUDGET.json", dataset="toy", data_path=tmp_path / "reseeded.h5",
                       listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    print(err.value)
    assert "private record(s) of toy were released without noise as public data of run 'public' of toy" in str(err.value)
    # the same split declaring a use of unknown cost: refused the same way, it keeps no declaration, so the first
    # split (back to its seed, as the message advises) is released again
    unknown = {"description": "settings chosen on these records", "epsilon": None, "delta": None}
    with pytest.raises(PrivacyError, match="were released without noise as public data of run 'public' of toy"):
        release_budget(tmp_path / "r" / "toy2" / "BUDGET.json", dataset="toy", data_path=tmp_path / "reseeded.h5",
                       listed=[("dp", {**dp_run(), "dp_guarantee": False})], budget=BUDGET, curator_dir=curator,
                       declared=unknown)
    with CuratorRecord(curator).transaction(create=False) as record:
        assert record.rows("declared") == []
    release_budget(tmp_path / "r" / "toy3" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("public", public_run())], budget=BUDGET, curator_dir=curator)


def test_records_released_as_private_can_never_become_public(tmp_path, npz):
    curator = tmp_path / "curator"
    splits = prepare(settings(npz), "toy", tmp_path / "toy.h5")
    release_budget(tmp_path / "r" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    fresh, exposed = tmp_path / "fresh.npz", tmp_path / "exposed.npz"
    np.savez(fresh, images=indexed_images(100, seed=7), labels=np.arange(100) % 4)
    np.savez(exposed, images=splits["train"].images[:40], labels=splits["train"].labels[:40])
    prepare(settings(fresh, public={"source": "npz", "path": str(exposed)}), "other", tmp_path / "other.h5")
    with pytest.raises(PrivacyError, match=r"40 public record\(s\) of other were private records of the released run 'dp' of toy"):
        release_budget(tmp_path / "r" / "other" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                       listed=[("public", public_run())], budget=BUDGET, curator_dir=curator)


def test_a_declared_earlier_use_of_unknown_cost_leaves_no_guarantee_and_a_known_one_is_counted(tmp_path, npz):
    """A use of unknown cost: account's verdict of every run of the dataset is false, and a run still stating a
    guarantee (accounted before, or under another name for the same records) is refused at the budget."""
    for name in ("toy", "other"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    run = dp_run()
    unknown = {"description": "tuned on these records", "epsilon": None, "delta": None}
    roomy = {**BUDGET, "epsilon": 30.0}
    assert unknown_cost_reasons({**unknown, "epsilon": 2.0, "delta": 0.0}, "toy") == [] == unknown_cost_reasons(None, "toy")
    (reason,) = unknown_cost_reasons(unknown, "toy")  # the reason account gives each run of toy
    assert reason.startswith("data.toy.earlier_use declares a use of these records of unknown cost")
    known = release_budget(tmp_path / "b" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                           listed=[("dp", run)], budget={**BUDGET, "epsilon": 30.0}, curator_dir=tmp_path / "cb",
                           declared={"description": "an earlier release", "epsilon": 2.0, "delta": 1e-6})
    assert known["epsilon_with_declared_earlier_use"] == pytest.approx(known["epsilon"] + 2.0)
    with pytest.raises(PrivacyError, match="with the declared earlier uses' epsilon 2"):
        release_budget(tmp_path / "c" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5", listed=[("dp", run)],
                       budget={**BUDGET, "epsilon": known["epsilon"] + 1.0}, curator_dir=tmp_path / "cc",
                       declared={"description": "an earlier release", "epsilon": 2.0, "delta": 1e-6})
    with pytest.raises(PrivacyError, match=r"^run 'dp' states dp_guarantee true, but an earlier use of unknown cost of "
                                           r"toy's private records is declared \(data.toy.earlier_use; the curator's"):
        release_budget(tmp_path / "a" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                       listed=[("dp", run)], budget=roomy, curator_dir=tmp_path / "ca", declared=unknown)
    accounted = {**run, "dp_guarantee": False, "epsilon": None, "reasons": [reason]}
    stated = release_budget(tmp_path / "a" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                            listed=[("dp", accounted)], budget=roomy, curator_dir=tmp_path / "ca", declared=unknown)
    assert [row["released"] for row in stated["runs"] if row["run"] == "dp"] == [False]
    assert "tuned on these records; its cost is not known and is NOT included" in stated["statement"]
    # before any number: the statement's first sentence and the key ahead of "epsilon" in BUDGET.json
    written = json.loads((tmp_path / "a" / "BUDGET.json").read_text())
    assert written["statement"].startswith("No total bounds every use of the records the curator holds (these or "
                                           "others): an earlier use of unknown cost is declared (tuned on these records)")
    assert list(written).index("no_bounded_total") < list(written).index("epsilon")
    assert "no_bounded_total" not in json.loads((tmp_path / "b" / "BUDGET.json").read_text())
    # the user's own record holds the known use too (toy's records, released under another team's record above)
    assert stated["epsilon_with_declared_earlier_use"] == pytest.approx(stated["epsilon"] + 2.0)
    # the declaration stays with the records: another name for them, declaring nothing, releases no guarantee either
    with pytest.raises(PrivacyError, match=r"of other's private records is declared \(data.toy.earlier_use; .* remove "
                                           r"it from data.other.release"):
        release_budget(tmp_path / "o" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                       listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "ca")
    assert not (tmp_path / "o" / "BUDGET.json").exists()


def test_another_datasets_declared_use_counts_before_its_own_budget_ran(tmp_path, npz):
    """Two names of one configuration over the same records, only one declaring a use: the other's budget may run
    first, and keeps and counts that use, known (added to its total) or of unknown cost (no guarantee)."""
    for name in ("toy", "other"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    roomy = {**BUDGET, "epsilon": 30.0}
    known = {"description": "an earlier release", "epsilon": 2.0, "delta": 1e-6}
    stated = release_budget(tmp_path / "k" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                            listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "k",
                            other_declarations=[("toy", tmp_path / "toy.h5", known)])
    assert stated["epsilon_with_declared_earlier_use"] == pytest.approx(stated["epsilon"] + 2.0)
    assert [row["released"] for row in stated["runs"]] == [True]
    unknown = {"description": "tuned on these records", "epsilon": None, "delta": None}
    refusal = r"of other's private records is declared \(data.toy.earlier_use"
    with pytest.raises(PrivacyError, match=refusal):
        release_budget(tmp_path / "o" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                       listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "c",
                       other_declarations=[("toy", tmp_path / "toy.h5", unknown)])
    # kept despite the refusal: the next release of these records under any name knows it
    with pytest.raises(PrivacyError, match=refusal):
        release_budget(tmp_path / "o" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                       listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "c")
    # another dataset of other records declaring such a use: kept and stated, and this release not refused
    for name, seed in (("fresh", 9), ("apart", 11)):
        np.savez(tmp_path / f"{name}.npz", images=indexed_images(400, seed=seed), labels=np.arange(400) % 4)
        prepare(settings(tmp_path / f"{name}.npz"), name, tmp_path / f"{name}.h5")
    stated = release_budget(tmp_path / "f" / "BUDGET.json", dataset="fresh", data_path=tmp_path / "fresh.h5",
                            listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "c",
                            other_declarations=[("apart", tmp_path / "apart.h5", {**unknown, "description": "apart"})])
    assert [row["released"] for row in stated["runs"]] == [True]
    written = json.loads((tmp_path / "f" / "BUDGET.json").read_text())
    assert {"description": "apart", "epsilon": None, "delta": None, "declared_by": ["apart"]} in \
        written["declared_earlier_uses"] and written["statement"].startswith("No total bounds every use")


def test_a_use_of_unknown_cost_is_kept_even_where_the_records_budget_is_spent(tmp_path, npz):
    """A list with no guarantee releases nothing, so a budget already spent refuses nothing: the declaration is kept,
    and a later name for the same records, declaring nothing, cannot release with a guarantee."""
    for name in ("spent", "again", "later"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    curator = tmp_path / "curator"
    first = release_budget(tmp_path / "r" / "spent" / "BUDGET.json", dataset="spent", data_path=tmp_path / "spent.h5",
                           listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    unknown = {"description": "settings chosen on these records", "epsilon": None, "delta": None}
    accounted = {**dp_run(), "dp_guarantee": False, "epsilon": None}
    checked = release_budget(tmp_path / "r" / "again" / "BUDGET.json", dataset="again", data_path=tmp_path / "again.h5",
                             listed=[("dp", accounted)], budget={**BUDGET, "epsilon": 5.0}, curator_dir=curator,
                             declared=unknown)
    assert checked["epsilon"] == pytest.approx(first["epsilon"]) and first["epsilon"] > 5.0  # past it: no refusal
    assert [row["released"] for row in checked["runs"] if row["run"] == "dp"] == [False]
    with pytest.raises(PrivacyError, match=r"of later's private records is declared \(data.again.earlier_use;"):
        release_budget(tmp_path / "r" / "later" / "BUDGET.json", dataset="later", data_path=tmp_path / "later.h5",
                       listed=[("dp", dp_run())], budget={**BUDGET, "epsilon": 30.0}, curator_dir=curator)


def test_a_use_of_unknown_cost_is_kept_when_the_release_that_declares_it_is_refused(tmp_path, npz):
    """Declared after a release was shared, the use makes the run's verdict false, and the shared folder is never
    replaced: that refusal keeps the declaration, so another name for the same records cannot release either."""
    for name in ("toy", "other"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    curator, run = tmp_path / "curator", dp_run()
    release_budget(tmp_path / "r" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("dp", run)], budget=BUDGET, curator_dir=curator)
    shared = tmp_path / "r" / "toy" / "dp"  # the folder release_run built from it
    shared.mkdir()
    (shared / "privacy.json").write_text(json.dumps(run))
    (shared / "synthetic.h5").write_bytes(b"")
    unknown = {"description": "settings chosen on these records", "epsilon": None, "delta": None}
    with pytest.raises(PrivacyError, match="holds a release with a DP guarantee that run 'dp' no longer has"):
        release_budget(tmp_path / "r" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                       listed=[("dp", {**run, "dp_guarantee": False, "epsilon": None})], budget=BUDGET,
                       curator_dir=curator, declared=unknown)
    with pytest.raises(PrivacyError, match=r"of other's private records is declared \(data.toy.earlier_use;"):
        release_budget(tmp_path / "r" / "other" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                       listed=[("dp", dp_run())], budget={**BUDGET, "epsilon": 30.0}, curator_dir=curator)


def test_a_declared_earlier_use_travels_with_the_records_and_counts_once(tmp_path, npz):
    """A declares an earlier use and releases; B, over the same records, declares nothing: B's budget composes
    A's declaration (and is refused when it no longer fits); a third name repeating it counts it once."""
    curator = tmp_path / "curator"
    for name in ("a", "b", "c"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    earlier = {"description": "released with tool X in 2025", "epsilon": 5.0, "delta": 1e-6}
    run = dp_run(sigma=0.8)
    a = release_budget(tmp_path / "r" / "a" / "BUDGET.json", dataset="a", data_path=tmp_path / "a.h5",
                       listed=[("run", run)], budget=BUDGET, curator_dir=curator, declared=earlier)
    assert a["epsilon_with_declared_earlier_use"] == pytest.approx(a["epsilon"] + 5.0)
    assert a["epsilon_with_declared_earlier_use"] < 10.0
    with pytest.raises(PrivacyError) as err:
        release_budget(tmp_path / "r" / "b" / "BUDGET.json", dataset="b", data_path=tmp_path / "b.h5",
                       listed=[("run", dp_run(sigma=0.8))], budget=BUDGET, curator_dir=curator)
    print(err.value)
    assert "with the declared earlier uses' epsilon 5" in str(err.value) and "over data.b.privacy_budget" in str(err.value)
    roomy = release_budget(tmp_path / "r" / "c" / "BUDGET.json", dataset="c", data_path=tmp_path / "c.h5",
                           listed=[("run", dp_run(sigma=0.8))], budget={**BUDGET, "epsilon": 30.0},
                           curator_dir=curator, declared=dict(earlier))
    (declared,) = roomy["declared_earlier_uses"]  # declared by a and by c: one use of the records
    assert declared["declared_by"] == ["a", "c"] and declared["epsilon"] == 5.0
    assert roomy["epsilon_with_declared_earlier_use"] == pytest.approx(roomy["epsilon"] + 5.0)
    assert "released with tool X in 2025" in roomy["statement"]
    # the total delta is the budget's: the pipeline's releases are composed at what the declaration leaves
    assert roomy["delta"] == pytest.approx(1e-5 - 1e-6) and roomy["delta_with_declared_earlier_use"] == pytest.approx(1e-5)


def test_a_declared_delta_over_the_budgets_delta_is_refused(tmp_path, npz):
    prepare(settings(npz), "toy", tmp_path / "toy.h5")
    with pytest.raises(PrivacyError) as err:
        release_budget(tmp_path / "r" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                       listed=[("dp", dp_run())], budget=BUDGET, curator_dir=tmp_path / "curator",
                       declared={"description": "an earlier release", "epsilon": 1.0, "delta": 1e-3})
    print(err.value)
    assert "total delta 0.001, not below data.toy.privacy_budget delta 1e-05" in str(err.value)
    assert not (tmp_path / "r" / "BUDGET.json").exists()


def test_a_declared_delta_of_other_records_never_refuses_a_dataset_and_its_stated_delta_grows_instead(tmp_path, npz):
    """A declares an earlier use taking most of its roomy delta, and its own total delta stays its budget's; B holds
    none of A's records and a smaller budget: B is released (the check composes B's records alone) and its
    BUDGET.json states a delta that counts A's declaration, above B's budget, rather than refusing B for a use of
    records it does not hold."""
    curator = tmp_path / "curator"
    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(400, seed=1), labels=np.arange(400) % 4)
    prepare(settings(npz), "a", tmp_path / "a.h5")
    prepare(settings(other), "b", tmp_path / "b.h5")
    release_budget(tmp_path / "r" / "a" / "BUDGET.json", dataset="a", data_path=tmp_path / "a.h5",
                   listed=[("run", public_run())], budget={**BUDGET, "delta": 1e-3}, curator_dir=curator,
                   declared={"description": "released with tool X", "epsilon": 1.0, "delta": 8e-4})
    a = json.loads((tmp_path / "r" / "a" / "BUDGET.json").read_text())
    assert a["delta"] == pytest.approx(2e-4) and a["delta_with_declared_earlier_use"] == pytest.approx(1e-3)
    checked = release_budget(tmp_path / "r" / "b" / "BUDGET.json", dataset="b", data_path=tmp_path / "b.h5",
                             listed=[("run", dp_run())], budget=BUDGET, curator_dir=curator)
    stated = json.loads((tmp_path / "r" / "b" / "BUDGET.json").read_text())
    assert checked["declared_earlier_uses"] == [] and checked["released_before"] == []  # the check: B's records alone
    assert stated["delta"] == pytest.approx(BUDGET["delta"] / 2)
    assert stated["delta_with_declared_earlier_use"] == pytest.approx(BUDGET["delta"] / 2 + 8e-4)
    assert stated["epsilon_with_declared_earlier_use"] == pytest.approx(stated["epsilon"] + 1.0)
    assert "0.000805)-DP with respect to any one record" in stated["statement"]
    assert "released with tool X" in stated["statement"] and "protects no one record" not in stated["statement"]


def test_a_stated_total_delta_not_below_one_over_n_says_it_protects_no_one_record():
    checked = {"dataset": "b", "budget": BUDGET, "num_private_records": 1000, "runs": []}
    declared = [{"description": "lost", "epsilon": 1.0, "delta": 2e-3, "declared_by": ["a"]}]
    stated = public_budget(checked, all_released=[], all_declared=declared)
    assert stated["delta_with_declared_earlier_use"] == pytest.approx(2.005e-3)  # 1/n = 1e-3
    assert "This total protects no one record: its delta = 0.002005 is not below 1/n" in stated["statement"]
    assert "protects no one record" not in public_budget({**checked, "num_private_records": 100}, all_released=[],
                                                         all_declared=declared)["statement"]
    from dpsad.card import dataset_card
    from dpsad.synthetic import SyntheticData

    synthetic = SyntheticData(np.zeros((4, 8, 8, 1), np.uint8), np.arange(4) % 4,
                              {"dataset": "b", "run": "dp", "method": "dpsad", "class_names": json.dumps(list("abcd"))})
    for n, weak in ((1000, True), (100, False)):
        card = dataset_card({**dp_run(), "num_private_records": n}, stated, synthetic, dataset="b", run="dp",
                            samples=False)
        assert ("It protects no one record: its delta = 0.002005 is not below 1/n" in card) is weak, card


def test_the_same_source_images_at_another_size_are_the_same_records(tmp_path, npz):
    """Prepared at image_size 16 and 32, the same 28x28 source images share one budget."""
    curator = tmp_path / "curator"
    for size in (16, 32):
        prepare(settings(npz, image_size=size), f"at{size}", tmp_path / f"at{size}.h5")
    assert read_attrs(tmp_path / "at16.h5")["private_records_sha256"] != read_attrs(tmp_path / "at32.h5")["private_records_sha256"]
    first = release_budget(tmp_path / "r" / "at16" / "BUDGET.json", dataset="at16", data_path=tmp_path / "at16.h5",
                           listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    assert "as read from its source (before any resizing" in first["statement"] and "mirrored" in first["records_not_detected"]
    with pytest.raises(PrivacyError, match="at32's private records \\(released before as at16: the same records\\)"):
        release_budget(tmp_path / "r" / "at32" / "BUDGET.json", dataset="at32", data_path=tmp_path / "at32.h5",
                       listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator)
    # an image folder resized while it is read is recognised the same way
    from PIL import Image

    images = indexed_images(60)
    for i, image in enumerate(images):
        (tmp_path / "folder" / str(i % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[..., 0]).save(tmp_path / "folder" / str(i % 3) / f"{i}.png")
    for size in (16, 32):
        prepare({"source": "imagefolder", "root": str(tmp_path / "folder"), "channels": 1, "image_size": size,
                 "class_names": ["0", "1", "2"], "test_fraction": 0.2, "public_fraction": 0.1,
                 "private_fraction": 0.9, "seed": 0}, f"folder{size}", tmp_path / f"folder{size}.h5")
    small, large = (split_digest_kinds(tmp_path / f"folder{size}.h5", "private") for size in (16, 32))
    known = {bytes(r) for kind in large for r in kind}
    assert records_among(np.zeros((0, 16), np.uint8), small, known) == len(small[0])  # every record, by its digest as read


def test_another_record_still_counts_the_releases_of_the_one_the_workspace_used(tmp_path, npz):
    workspace = tmp_path / "ws"
    prepare(settings(npz), "toy", workspace / "toy.h5")
    common = dict(dataset="toy", data_path=workspace / "toy.h5", budget=BUDGET, workspace=workspace)
    release_budget(workspace / "release" / "toy" / "BUDGET.json", listed=[("dp", dp_run())], curator_dir=tmp_path / "old",
                   **common)
    shutil.rmtree(workspace / "release")
    with pytest.raises(PrivacyError, match="releasing run 'dp' would bring the total"):
        release_budget(workspace / "release" / "toy" / "BUDGET.json", listed=[("dp", dp_run())],
                       curator_dir=tmp_path / "new", **common)
    # the old record moved away: refused until it is back where it was seen, or used from its new folder
    shutil.move(tmp_path / "old", tmp_path / "moved")
    with pytest.raises(PrivacyError) as err:
        release_budget(workspace / "release" / "toy" / "BUDGET.json", listed=[("dp", dp_run())],
                       curator_dir=tmp_path / "new", **common)
    print(err.value)
    assert "cannot be read there" in str(err.value) and "python -m dpsad.curator declare-lost" in str(err.value)
    roomy = release_budget(workspace / "release" / "toy" / "BUDGET.json", listed=[("dp", dp_run())],
                           curator_dir=tmp_path / "moved", **{**common, "budget": {**BUDGET, "epsilon": 30.0}})
    assert roomy["released_before"] == ["toy/dp"]
    shutil.rmtree(workspace / "release")
    again = release_budget(workspace / "release" / "toy" / "BUDGET.json", listed=[("dp", dp_run())],
                           curator_dir=tmp_path / "new", **{**common, "budget": {**BUDGET, "epsilon": 30.0}})
    assert again["released_before"] == ["toy/dp"] and str(tmp_path / "moved" / "curator.sqlite") in [
        other["location"] for other in again["other_curator_records"]]
    assert again["epsilon"] > roomy["epsilon"]


def test_a_declared_epsilon_without_its_delta_is_refused():
    from dpsad.config import load_config_file
    from dpsad.errors import DpsadError
    from workflow_helpers import ROOT

    declared = {"data": {"mnist5k": {"earlier_use": {"description": "an earlier release", "epsilon": 2.0}}}}
    with pytest.raises(DpsadError, match="earlier_use gives epsilon 2 but no delta, expected its delta too"):
        load_config_file(ROOT / "config" / "config.yaml", declared)
    declared["data"]["mnist5k"]["earlier_use"]["delta"] = 0.0
    assert load_config_file(ROOT / "config" / "config.yaml", declared)["data"]["mnist5k"]["earlier_use"]["delta"] == 0.0
    for key in ("epsilon", "delta"):  # a NaN cost compares False with every budget: it would pass them all
        nan = {"data": {"mnist5k": {"earlier_use": {**declared["data"]["mnist5k"]["earlier_use"], key: float("nan")}}}}
        with pytest.raises(DpsadError, match=rf"data.mnist5k.earlier_use.{key} = nan, expected a finite number"):
            load_config_file(ROOT / "config" / "config.yaml", nan)


def test_the_curator_record_keeps_record_sets_by_fingerprint_and_refuses_an_edited_row(tmp_path, npz):
    import sqlite3

    curator = CuratorRecord(tmp_path / "curator")
    prepare(settings(npz), "toy", tmp_path / "toy.h5")
    release_budget(tmp_path / "r" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("dp", dp_run())], budget=BUDGET, curator_dir=curator.folder)
    with sqlite3.connect(curator.path) as db:
        assert db.execute("SELECT count(*) FROM record_sets").fetchone()[0] == 2  # the private and the public set
        body = json.loads(db.execute("SELECT body FROM rows WHERE sequence = 1").fetchone()[0])
        body["entries"][0]["noise_multiplier"] *= 2  # a hand edit that would halve the stated cost
        db.execute("UPDATE rows SET body = ? WHERE sequence = 1", (json.dumps(body, sort_keys=True),))
    with pytest.raises(DpsadError, match="row 1 does not chain to the rows before it"):
        with curator.transaction():
            pass
    curator.path.write_bytes(b"not a database" * 100)
    with pytest.raises(DpsadError, match="is damaged"):
        with curator.transaction():
            pass


def test_a_resume_checkpoint_from_other_inputs_is_discarded(tmp_path, caplog):
    labels = tmp_path / "labels.h5"
    labels.write_bytes(b"labels of a MoCo fitted on the private split")
    before = inputs_sha256([labels])
    checkpoint = tmp_path / "teacher.pt.resume"
    save_checkpoint(checkpoint, {"settings_digest": before, "step": 20})
    log = logging.getLogger("dpsad-test")
    assert resume_state(checkpoint, before, log)["step"] == 20
    labels.write_bytes(b"labels of a MoCo fitted on the public split")
    after = inputs_sha256([labels])
    assert after != before
    with caplog.at_level(logging.WARNING):
        assert resume_state(checkpoint, after, log) is None
    assert "inputs whose content has changed" in caplog.text and not checkpoint.exists()
    # the same content at another time or place is the same input
    moved = tmp_path / "moved.h5"
    shutil.copyfile(labels, moved)
    assert inputs_sha256([moved]) == after


def test_teacher_features_of_a_record_do_not_depend_on_the_other_records(tmp_path, log):
    from dpsad.moco.teacher_features import teacher_features
    from helpers import tiny_data
    from test_training import teacher

    path, _ = teacher(tmp_path, log)
    images = tiny_data().splits["train"].images
    whole = teacher_features(images, path, torch.device("cpu"), batch=5)
    without_first = teacher_features(images[1:], path, torch.device("cpu"), batch=7)
    np.testing.assert_allclose(whole[1:], without_first, atol=1e-5)


def test_every_sentence_states_epsilon_and_delta_rounded_up():
    """Review: statements rounded to the nearest, so a total of 2.00049 read "(2, delta)-DP", less than the bound."""
    from dpsad.card import dataset_card
    from dpsad.privacy.stated import rounded_up
    from dpsad.synthetic import SyntheticData, guarantee_notes

    assert [rounded_up(v) for v in (2.00049, 1.23449, 2.0, 0.1, 9.99951, 0.0)] == ["2.001", "1.235", "2", "0.1", "10", "0"]
    above = 1e-5 * (1 + 1e-7)  # a delta just above 1e-5
    assert rounded_up(above, 6) == "1.00001e-05" and rounded_up(1e-5, 6) == "1e-05"
    run = {**dp_run(), "epsilon": 2.00049, "delta": above, "accountant": "pld", "num_private_records": 1000}
    assert guarantee_notes(run).startswith("(2.001, 1.00001e-05)-DP")
    checked = {"dataset": "b", "budget": BUDGET, "num_private_records": 1000, "runs": []}
    declared = [{"description": "earlier", "epsilon": 2.00049, "delta": 1e-6, "declared_by": ["b"]}]
    stated = public_budget(checked, all_released=[], all_declared=declared)
    assert stated["epsilon_with_declared_earlier_use"] == pytest.approx(2.00049)
    assert "is (2.001, 1e-05)-DP with respect to any one record" in stated["statement"]
    synthetic = SyntheticData(np.zeros((4, 8, 8, 1), np.uint8), np.arange(4) % 4,
                              {"dataset": "b", "run": "dp", "method": "dpsad", "class_names": json.dumps(list("abcd"))})
    card = dataset_card({**run, "epsilon": 1.2345641}, stated, synthetic, dataset="b", run="dp", samples=False)
    assert "**(1.23457, 1.00001e-05)-differentially private**" in card and "**(2.00049, 1e-05)-DP**" in card


def test_a_release_refuses_a_budget_composed_before_a_configured_use_was_declared_as_it_is_now():
    from dpsad.release_folder import check_budget_counts_the_configured_uses

    stand_in = {"description": "counts released with the Laplace mechanism", "epsilon": 1.0, "delta": 0.0}
    tuned = {"description": "tuned", "epsilon": None, "delta": None}
    # the uses of every record the curator holds, "tuned" among them (another dataset's, of other records)
    budget = {"declared_earlier_uses": [{**stand_in, "declared_by": ["toy"]}, {**tuned, "declared_by": ["far"]}],
              "composed_with_uses": {"toy": stand_in}}
    check_budget_counts_the_configured_uses(budget, "BUDGET.json", {"toy": {**stand_in, "epsilon": 1}, "plain": None})
    for uses, named in (({"toy": {**stand_in, "epsilon": 2.0}}, "data.toy.earlier_use"),
                        ({"toy": stand_in, "other": tuned}, "data.other.earlier_use")):
        with pytest.raises(PrivacyError, match=rf"^BUDGET.json was composed before the earlier use now declared in "
                                               rf"{named}, expected a budget that counts it: compose it again"):
            check_budget_counts_the_configured_uses(budget, "BUDGET.json", uses)
    with pytest.raises(PrivacyError, match="data.toy.earlier_use"):  # a budget of an older version, without the list
        check_budget_counts_the_configured_uses({}, "BUDGET.json", {"toy": stand_in})


def test_a_use_declared_after_a_budget_was_composed_is_one_it_left_out(tmp_path, npz):
    """BUDGET.json is a snapshot: a use of its records declared later (another name, another workspace) is found
    in the curator's record when a run is released from it, and so is a use of unknown cost."""
    from dpsad.privacy.books.release_budget import uses_the_budget_left_out
    from dpsad.release_folder import record_sets

    for name in ("toy", "other"):
        prepare(settings(npz), name, tmp_path / f"{name}.h5")
    roomy = {**BUDGET, "epsilon": 30.0}
    known = {"description": "an earlier release", "epsilon": 2.0, "delta": 1e-6}
    release_budget(tmp_path / "t" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                   listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "c", declared=known)
    budget = json.loads((tmp_path / "t" / "BUDGET.json").read_text())
    records = record_sets("toy", tmp_path / "toy.h5")
    assert uses_the_budget_left_out(budget["declared_earlier_uses"], records, tmp_path / "c", tmp_path) == []
    later = {"description": "released again elsewhere", "epsilon": 1.0, "delta": 0.0}
    release_budget(tmp_path / "o" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                   listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "c", declared=later)
    (left_out,) = uses_the_budget_left_out(budget["declared_earlier_uses"], records, tmp_path / "c", tmp_path)
    assert left_out["description"] == "released again elsewhere" and left_out["declared_by"] == ["other"]
    unknown = {"description": "tuned on them", "epsilon": None, "delta": None}
    with pytest.raises(PrivacyError):  # the other name's own release is refused, the use is kept
        release_budget(tmp_path / "u" / "BUDGET.json", dataset="other", data_path=tmp_path / "other.h5",
                       listed=[("dp", dp_run())], budget=roomy, curator_dir=tmp_path / "c", declared=unknown)
    assert "tuned on them" in {d["description"] for d in uses_the_budget_left_out(budget["declared_earlier_uses"], records, tmp_path / "c",
                                                                                  tmp_path)}


def test_a_release_is_checked_only_for_the_records_its_budget_capped(tmp_path):
    """A data.h5 prepared again from other records, the budget and the trainings kept (``--touch``), is not the
    one the budget's check capped: its release is refused, not checked for the new records."""
    np.savez(tmp_path / "a.npz", images=indexed_images(400, seed=1), labels=np.arange(400) % 4)
    np.savez(tmp_path / "b.npz", images=indexed_images(400, seed=2), labels=np.arange(400) % 4)
    prepare(settings(tmp_path / "a.npz"), "toy", tmp_path / "a.h5")
    prepare(settings(tmp_path / "b.npz"), "toy", tmp_path / "b.h5")
    run, budget_path, check_path = dp_run(), tmp_path / "t" / "BUDGET.json", tmp_path / "t" / "check.json"
    release_budget(budget_path, dataset="toy", data_path=tmp_path / "a.h5", listed=[("dp", run)], budget=BUDGET,
                   curator_dir=tmp_path / "c", workspace=tmp_path, check_path=check_path)
    budget = json.loads(budget_path.read_text())
    release_folder.check_budget_counts_the_records_uses(budget, budget_path, run,
                                                        release_folder.record_sets("toy", tmp_path / "a.h5"),
                                                        tmp_path / "c", tmp_path, check_path)
    refusal = r"check.json does not name the private records of the data.h5 this release is checked for"
    with pytest.raises(PrivacyError, match=refusal):
        release_folder.check_budget_counts_the_records_uses(budget, budget_path, run,
                                                            release_folder.record_sets("toy", tmp_path / "b.h5"),
                                                            tmp_path / "c", tmp_path, check_path)
    # the same private records beside another public split (a separate public source changed): it may hold records
    # private before, which the check looked for in the public split it was composed with, not in this one
    same = release_folder.record_sets("toy", tmp_path / "a.h5")
    other_public = RecordSets("toy", same.private, release_folder.record_sets("toy", tmp_path / "b.h5").public)
    with pytest.raises(PrivacyError, match=refusal.replace("private", "public")):
        release_folder.check_budget_counts_the_records_uses(budget, budget_path, run, other_public, tmp_path / "c",
                                                            tmp_path, check_path)
    for key in ("private_records", "public_records"):  # as earlier versions wrote it: the records are not taken on trust
        check = json.loads(check_path.read_text())
        del check[key]
        check_path.with_name("old.json").write_text(json.dumps(check))
        with pytest.raises(PrivacyError, match=refusal.replace("private", key.split("_")[0]).replace("check.json", "old.json")):
            release_folder.check_budget_counts_the_records_uses(budget, budget_path, run, same, tmp_path / "c",
                                                                tmp_path, check_path.with_name("old.json"))
