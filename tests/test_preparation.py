"""Every use of the private records names the preparation of data.h5 it read; a training kept past a new
preparation (``--touch``) is refused by the verdict and by the budget, before the curator's record is touched."""

from __future__ import annotations

import json

import pytest
from test_records_budget import BUDGET, dp_run, public_run, release_budget, settings
from test_release_budget import copy_of
from workflow_helpers import snakemake

from dpsad import release_folder
from dpsad.data.datafile import prepare, read_attrs
from dpsad.errors import PrivacyError
from dpsad.privacy.books.preparation import RECORDS, RECORDS_ID, records_problem, stamped


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
    refused_alike = {**dp_run(), "dp_guarantee": False}
    assert release_budget(tmp_path / "release" / "toy" / "BUDGET.json", dataset="toy", data_path=tmp_path / "toy.h5",
                          listed=[("no", refused_alike)], budget=BUDGET, curator_dir=tmp_path / "c")["runs"][0][
        "released"] is False


@pytest.mark.e2e
def test_every_private_use_in_a_run_names_the_preparation_it_read(tiny_run):
    """Each stage that reads the private split (the DP trainings, PE, the cluster report) stamps its entries."""
    results = tiny_run / "results" / "mnist5k"
    expected = read_attrs(results / "data.h5")[RECORDS_ID]
    stages = set()
    for ledger in results.rglob("*ledger*.json"):
        for entry in json.loads(ledger.read_text())["entries"]:
            if entry["private"]:
                assert entry.get(RECORDS) == expected, (ledger, entry["stage"])
                stages.add(entry["stage"])
    assert {"distill_student", "discriminator", "private_evolution", "train_dpgan_critic"} <= stages, stages
    privacy = json.loads((results / "dpsad_eps10" / "privacy.json").read_text())
    assert privacy["dp_guarantee"] and all(c[RECORDS] == expected for c in privacy["components"] if c["private"])


@pytest.mark.e2e
def test_trainings_kept_by_touch_past_a_new_preparation_are_refused(tiny_run, tmp_path_factory):
    """The data prepared again, the trainings and verdicts kept by --touch: the budget refuses the runs, and an
    account run again states no guarantee, naming the stage."""
    cwd = copy_of(tiny_run, tmp_path_factory, forget_history=True)
    args = ("--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml")
    snakemake(cwd, "results/mnist5k/data.h5", "--forcerun", "prepare_data", *args)
    privacy = [f"results/mnist5k/{run}/privacy.json" for run in ("dpsad_eps10", "pe_eps1")]
    snakemake(cwd, *privacy, "--touch", *args)
    refused = snakemake(cwd, "release", *args, check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "read another preparation of the private records" in output
    assert not (cwd / "release" / "mnist5k" / "BUDGET.json").exists()
    snakemake(cwd, privacy[0], "--forcerun", "account", "--allowed-rules", "account", *args)
    verdict = json.loads((cwd / privacy[0]).read_text())
    assert verdict["dp_guarantee"] is False
    assert any("read another preparation of the private records" in reason for reason in verdict["reasons"])
