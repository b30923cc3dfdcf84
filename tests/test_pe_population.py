"""DP-SAD from Private Evolution's population: a teacher with ``split: population`` trains on a PE run's population
(post-processing of its votes), and every descendant composes that run's spending."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import MODEL, tiny_data
from workflow_helpers import planned_jobs, snakemake

from dpsad.card import method_kind
from dpsad.config import inputs, validate_config
from dpsad.errors import DpsadError
from dpsad.files.artifacts import save_torch
from dpsad.pe.population import POPULATION_SPLIT, population_data
from dpsad.privacy.books.ledger import make_entry, read_ledgers
from workflow_helpers import Wildcards


def chain_config(teacher: dict | None = None, pe_run: dict | None = None, chain: dict | None = None,
                 sweep: dict | None = None) -> dict:
    """A validated config: a PE run at half the budget, a teacher on its population, DP-SAD from that teacher."""
    population = {"split": "population", "population": "pe_half", "init": "public", "steps": 6, "batch_size": 4,
                  "model": MODEL, **(teacher or {})}
    return validate_config({
        "datasets": ["toy"], "data": {"toy": {"source": "mnist5k"}},
        "teachers": {"public": {"split": "public", "steps": 6, "batch_size": 4, "model": MODEL},
                     "public_kmeans": {"split": "public", "labels": "kmeans", "init": "public", "steps": 6, "batch_size": 4},
                     "population": {key: value for key, value in population.items() if value is not None}},
        "runs": [{"name": "pe_half", "method": "pe", "teacher": "public", "target_epsilon": 5.0, **(pe_run or {})},
                 {"name": "chain", "method": "dpsad", "teacher": "population", "target_epsilon": 10.0, **(chain or {})}],
        **({"sweep": sweep} if sweep else {}),
    })


def test_a_population_teacher_reads_its_pe_runs_population_and_composes_its_ledger_and_no_other_teacher_does():
    config = chain_config()
    population = Wildcards(dataset="toy", teacher="population")
    assert inputs.teacher_population(config, population) == ["results/toy/pe_half/pe.pt"]
    named = inputs.with_upstream_ledgers(population=lambda wc: inputs.teacher_population(config, wc),
                                         init=lambda wc: inputs.teacher_init(config, wc))(population)
    assert named["upstream_ledgers"] == ["results/toy/pe_half/pe.ledger.json", "results/toy/teacher/public.ledger.json"]
    assert inputs.teacher_population(config, Wildcards(dataset="toy", teacher="public")) == []


def test_the_synthetic_datas_settings_digest_of_a_population_run_names_its_pe_runs_settings_and_no_other_does():
    """synthetic.h5's config_sha256 states what shaped the data: for DP-SAD from a population, the PE run's settings
    too (its votes' target here); a run that reads no population keeps its digest."""
    def digests(pe_run=None) -> dict:
        config = chain_config(pe_run=pe_run, chain=None)
        config["runs"].append({**config["runs"][1], "name": "beside", "teacher": "public"})
        config = validate_config(config)
        return {name: inputs.run_config_digest(config, Wildcards(dataset="toy", run=name))
                for name in ("pe_half", "chain", "beside")}

    base, more = digests(), digests({"target_epsilon": 4.0})
    assert base["pe_half"] != more["pe_half"] and base["chain"] != more["chain"]
    assert base["beside"] == more["beside"]


@pytest.mark.parametrize("teacher, pe_run, chain, message", [
    ({"population": None}, None, None, "teachers.population: split 'population' with population None, expected"),
    ({"split": "public"}, None, None, "teachers.population: split 'public' with population 'pe_half', expected"),
    ({"population": "chain"}, None, None, "population = 'chain', expected a run of method pe (pe_half)"),
    ({"labels": "none"}, None, None, "the teacher is on labels 'none' and the run on True, expected the same"),
    ({"labels": "kmeans"}, {"labels": "kmeans", "teacher": "public_kmeans"}, {"labels": "kmeans"},
     "the teacher is on labels 'kmeans' and the run on 'kmeans', expected the same, true or none"),
    (None, {"teacher": "population"}, None, "method pe with teacher 'population' on a PE run's population, expected"),
    (None, {"teacher": "nowhere"}, None, "teacher = 'nowhere', expected one of public, public_kmeans, population"),
    (None, None, {"target_epsilon": 5.0}, "target_epsilon = 5.0 distilling teacher 'population' on PE run 'pe_half' at 5.0"),
    (None, None, {"method": "nonprivate", "target_epsilon": None}, "method nonprivate samples teacher 'population'"),
])
def test_a_population_teacher_without_a_pe_run_on_its_labels_or_budget_left_is_refused(teacher, pe_run, chain, message):
    with pytest.raises(DpsadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        chain_config(teacher, pe_run, chain)


def test_a_sweep_on_a_population_teacher_is_refused_at_or_below_the_votes_target_and_not_above():
    """The sweep's DP-SAD runs distil sweep.teacher: at or below the PE run's target they would fail at planning,
    after the votes and the teacher had trained."""
    with pytest.raises(DpsadError, match=r"run 'sweep_dpsad_eps5': target_epsilon = 5.0 distilling teacher 'population'"):
        chain_config(sweep={"teacher": "population", "methods": ["dpsad"], "epsilons": [8, 5]})
    chain_config(sweep={"teacher": "population", "methods": ["dpsad"], "epsilons": [8]})


def test_a_population_is_the_teachers_training_split_only_with_the_datasets_shape_and_classes(tmp_path):
    data = tiny_data(size=12, classes=3)
    images = np.random.default_rng(0).integers(0, 256, (9, 12, 12, 1), dtype=np.uint8)
    path = tmp_path / "pe.pt"
    save_torch({"kind": "pe_population", "images": images, "labels": np.arange(9) % 3, "class_names": data.class_names,
                "settings": {}, "plan": {}}, path)
    read = population_data(path, data, True)
    assert list(read.splits) == [POPULATION_SPLIT] and (read.splits[POPULATION_SPLIT].images == images).all()
    assert read.splits[POPULATION_SPLIT].labels.tolist() == [0, 1, 2] * 3 and read.class_names == data.class_names
    with pytest.raises(DpsadError, match=r"expected \[N, 16, 16, 1\] as the dataset's"):
        population_data(path, tiny_data(size=16), True)
    with pytest.raises(DpsadError, match="expected the dataset's classes"):
        population_data(path, tiny_data(size=12, classes=4), True)
    assert population_data(path, tiny_data(size=12, classes=4), "none").num_classes == 4  # unconditional: labels unread


def test_the_card_names_dp_sad_from_a_pe_population_by_its_components():
    votes = make_entry(stage="sim_pe", private=True, mechanism="gaussian", sample_rate=1.0, noise_multiplier=2.0,
                       steps=3, clip_norm=1.0, noise_seed="secret")
    student = make_entry(stage="distill_student", private=True, mechanism="sgm", sample_rate=0.1,
                         noise_multiplier=1.0, steps=10, clip_norm=1.0, noise_seed="secret")
    assert method_kind("dpsad", {"components": [votes, student]}) == "dpsad from a pe population"
    assert method_kind("dpsad", {"components": [{**votes, "stage": "private_evolution"}, student]}) == "dpsad from a pe population"
    assert method_kind("dpsad", {"components": [student]}) == "dpsad"


@pytest.mark.e2e
def test_dp_sad_from_a_sim_pe_population_composes_the_votes_once_within_its_target(tiny_run, tmp_path):
    """Through Snakemake: Sim-PE at 5, a teacher fitted to its population (no private record read), DP-SAD from it
    to 10 in all: the votes' entry once in the student's verdict, the same entry as the PE run's own."""
    cwd = tmp_path / "copy"
    shutil.copytree(tiny_run, cwd, symlinks=True)  # the prepared data and the public teacher: only the chain runs
    overlay = tmp_path / "chain.yaml"
    overlay.write_text(
        "data: {mnist5k: {release: [public]}}\nruns:\n  - {name: public, method: public, teacher: public}\n"
        "  - {name: simpe_half, method: pe, target_epsilon: 5.0, pe: {simulator: true}}\n"
        "  - {name: chain, method: dpsad, teacher: population, target_epsilon: 10.0}\n"
        "teachers:\n  population: {split: population, population: simpe_half, init: public, steps: 6, batch_size: 8,\n"
        "               checkpoint_every: 3, warmup_steps: 2}\n")
    config = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", str(overlay))
    targets = ("results/mnist5k/chain/privacy.json", "results/mnist5k/simpe_half/privacy.json")
    planned = snakemake(cwd, *targets, "-n", *config)
    assert planned_jobs(planned) == {"train_pe": 1, "train_teacher": 1, "distill_student": 1, "account": 2}
    snakemake(cwd, *targets, "--cores", "2", *config)
    results = cwd / "results" / "mnist5k"
    (votes,) = [e for e in read_ledgers([results / "simpe_half" / "pe.ledger.json"]) if e["private"]]
    teacher = read_ledgers([results / "teacher" / "population.ledger.json"])
    own = [e for e in teacher if e["stage"] == "train_teacher[population]"]
    assert len(own) == 1 and not own[0]["private"] and "population of PE run 'simpe_half'" in own[0]["notes"]
    assert [e["uid"] for e in teacher if e["private"]] == [votes["uid"]]
    chain = json.loads((results / "chain" / "privacy.json").read_text())
    uids = [c["uid"] for c in chain["components"]]
    assert uids.count(votes["uid"]) == 1 and {"distill_student", "discriminator"} <= {c["stage"] for c in chain["components"]}
    assert chain["dp_guarantee"] is True and 9.5 < chain["epsilon"] <= 10.0
    alone = json.loads((results / "simpe_half" / "privacy.json").read_text())
    assert alone["dp_guarantee"] is True and 4.5 < alone["epsilon"] <= 5.0 < chain["epsilon"]
    assert torch.load(results / "teacher" / "population.pt", weights_only=False)["kind"] == "diffusion_model"
