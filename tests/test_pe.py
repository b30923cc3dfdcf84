"""Private Evolution: the vote histogram's sensitivity, its secret noise, the plan, the ledger, the population."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_config, tiny_data

from dpsad.config import pe_settings, teacher_settings
from dpsad.pe import PE_KIND, private_evolution
from dpsad.pe.variation import generate, strength_timesteps
from dpsad.privacy.accounting import SGMComponent, Accountant
from dpsad.privacy.mechanism.histogram import nearest_votes, noisy_histogram, plan_pe, selection_weights
from dpsad.privacy.books.ledger import read_ledgers, verdict
from dpsad.privacy.mechanism.dpsgd import dp_generators
from dpsad.sampling.draw import load_any_generator
from dpsad.training.diffusion_training import load_diffusion_model
from dpsad.training.teacher import train_teacher

CPU = torch.device("cpu")


def votes_case(seed=0, n=60, m=12, dim=5, classes=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, dim, generator=g), torch.randint(classes, (n,), generator=g), torch.randn(m, dim, generator=g),
            torch.arange(classes).repeat_interleave(m // classes))


@pytest.mark.parametrize("seed", range(5))
def test_removing_one_record_moves_one_count_by_one(seed):
    """Sensitivity 1 under add/remove: the noiseless histograms of neighbouring data sets differ by one vote."""
    private, labels, candidates, candidate_labels = votes_case(seed)
    counts = nearest_votes(private, labels, candidates, candidate_labels)
    assert int(counts.sum()) == len(private)
    for removed in range(len(private)):
        keep = torch.arange(len(private)) != removed
        neighbour = nearest_votes(private[keep], labels[keep], candidates, candidate_labels)
        difference = counts - neighbour
        assert int(difference.abs().sum()) == 1 and float(difference.double().norm()) == 1.0
        assert int(candidate_labels[difference.nonzero()[0, 0]]) == int(labels[removed])  # its own class


def test_each_record_votes_for_its_nearest_candidate_of_its_own_class():
    private = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    candidates = torch.tensor([[0.1, 0.0], [5.0, 5.1], [4.0, 4.0]])
    counts = nearest_votes(private, torch.tensor([0, 0]), candidates, torch.tensor([0, 1, 0]))
    assert counts.tolist() == [1, 0, 1]  # the second record's nearest is of class 1: it votes for its class's nearest
    with pytest.raises(ValueError, match="has no candidate"):
        nearest_votes(private, torch.tensor([0, 2]), candidates, torch.tensor([0, 1, 0]))


def test_the_histograms_noise_comes_from_secret_seeds_with_the_planned_spread():
    counts = torch.zeros(20000, dtype=torch.int64)
    first = noisy_histogram(counts, 3.0, dp_generators(None).noise)
    second = noisy_histogram(counts, 3.0, dp_generators(None).noise)
    assert dp_generators(None).seed_kind == "secret" and dp_generators(7).seed_kind == "fixed"
    assert not torch.equal(first, second)
    assert abs(float(first.std()) - 3.0) < 0.1 and abs(float(first.mean())) < 0.1


def test_selection_drops_counts_under_the_threshold_and_normalises_each_class():
    noisy = torch.tensor([5.0, 0.5, 3.0, -1.0, 0.2], dtype=torch.float64)
    weights = selection_weights(noisy, torch.tensor([0, 0, 0, 1, 1]), threshold=1.0)
    assert torch.allclose(weights, torch.tensor([5 / 8, 0.0, 3 / 8, 0.5, 0.5], dtype=torch.float64))


def test_the_plan_composes_to_the_target_and_grows_with_n_and_the_budget():
    small = plan_pe(1000, 10, 1.0, 1e-5, max_iterations=4, votes_per_noise=2.0, min_candidates_per_class=4,
                    max_candidates_per_class=100, threshold_sigmas=1.0)
    epsilon = Accountant("pld").epsilon([SGMComponent(small.noise_multiplier, 1.0, small.iterations)], 1e-5)
    assert 0.95 < epsilon <= 1.0
    large = plan_pe(1000, 10, 10.0, 1e-5, max_iterations=4, votes_per_noise=2.0, min_candidates_per_class=4,
                    max_candidates_per_class=100, threshold_sigmas=1.0)
    more = plan_pe(4000, 10, 1.0, 1e-5, max_iterations=4, votes_per_noise=2.0, min_candidates_per_class=4,
                   max_candidates_per_class=100, threshold_sigmas=1.0)
    assert large.candidates_per_class > small.candidates_per_class and large.iterations >= small.iterations
    assert more.candidates_per_class >= small.candidates_per_class and more.iterations >= small.iterations
    assert small.threshold == pytest.approx(small.noise_multiplier)
    # Each candidate's expected votes reach the aim whenever the plan says so.
    assert 100 / small.candidates_per_class >= 2.0 * small.noise_multiplier or "below the aim" in small.reason


def test_a_variation_keeps_its_parent_closer_than_a_fresh_image(tmp_path, log):
    teacher = tiny_teacher(tmp_path, log)
    model, diffusion, _ = load_diffusion_model(teacher, CPU)
    labels = torch.zeros(16, dtype=torch.long)
    parents = generate(model, diffusion, labels, parents=None, strength=1.0, steps=5, eta=1.0,
                       generator=torch.Generator().manual_seed(0))
    near = generate(model, diffusion, labels, parents=parents, strength=0.1, steps=5, eta=1.0,
                    generator=torch.Generator().manual_seed(1))
    fresh = generate(model, diffusion, labels, parents=None, strength=1.0, steps=5, eta=1.0,
                     generator=torch.Generator().manual_seed(1))
    assert float((near - parents).norm()) < float((fresh - parents).norm())
    assert strength_timesteps(500, 0.2, 10)[0] == 100 and strength_timesteps(500, 0.2, 10)[-1] == 0


def tiny_teacher(tmp_path, log):
    config = tiny_config()
    train_teacher(data=tiny_data(), settings=teacher_settings(config, "public"), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=CPU, out_path=tmp_path / "t.pt", loss_csv=tmp_path / "t.csv",
                  ledger_path=tmp_path / "t.json", stage_name="train_teacher", log=log)
    return tmp_path / "t.pt"


def test_a_pe_run_writes_a_population_whose_ledger_composes_to_the_target(tmp_path, log):
    teacher = tiny_teacher(tmp_path, log)
    config = tiny_config()
    settings = pe_settings(config, {"target_epsilon": 10.0, "delta": 1e-5, "pe": {"final_per_class": 5,
                                                                                   "sample_steps": 4}})
    entry = private_evolution(data=tiny_data(), settings=settings, labels_mode=True, teacher_path=teacher, device=CPU,
                              out_path=tmp_path / "pe.pt", ledger_path=tmp_path / "pe.json",
                              votes_csv=tmp_path / "votes.csv", upstream_ledgers=[str(tmp_path / "t.json")], log=log)
    assert entry["mechanism"] == "gaussian" and entry["private"] and entry["noise_seed"] == "secret"
    assert entry["clip_norm"] == 1.0 and entry["steps"] >= 1
    result = verdict(read_ledgers([tmp_path / "pe.json"]), delta=1e-5, accountant="pld", target_epsilon=10.0,
                     num_private_records=24)
    assert result["dp_guarantee"] is True and 9.5 < result["epsilon"] <= 10.0
    state = torch.load(tmp_path / "pe.pt", weights_only=False)
    assert state["kind"] == PE_KIND and state["images"].shape == (15, 12, 12, 1) and state["images"].dtype == np.uint8
    assert np.bincount(state["labels"]).tolist() == [5, 5, 5]
    draw, names = load_any_generator(tmp_path / "pe.pt", CPU)
    images, labels = draw({"n_per_class": 4, "n_samples": None, "batch_size": 4}).collect()
    assert names == ["0", "1", "2"] and images.shape == (12, 12, 12, 1) and np.bincount(labels).tolist() == [4, 4, 4]
    with pytest.raises(Exception, match="a class of a Private Evolution population that holds 5"):
        draw({"n_per_class": 7, "n_samples": None, "batch_size": 4})
    rows = (tmp_path / "votes.csv").read_text().splitlines()
    assert rows[0].startswith("iteration,") and len(rows) == entry["steps"] + 1


def test_pe_on_a_dp_teacher_spends_what_the_teacher_left_and_the_two_compose_to_the_target(tmp_path, log):
    """A DP teacher (tiny_config's ``dp``: epsilon 5 on the private split) as PE's generator: its spending is a fixed
    upstream component of PE's plan, so the votes get the rest of the run's 10: less than on a public teacher."""
    config = tiny_config()
    train_teacher(data=tiny_data(), settings=teacher_settings(config, "dp"), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=CPU, out_path=tmp_path / "dp.pt", loss_csv=tmp_path / "dp.csv",
                  ledger_path=tmp_path / "dp.json", stage_name="train_teacher[dp]", log=log)
    settings = pe_settings(config, {"target_epsilon": 10.0, "delta": 1e-5, "pe": {"final_per_class": 2,
                                                                                   "sample_steps": 2}})
    run = {"data": tiny_data(), "settings": settings, "labels_mode": True, "teacher_path": tmp_path / "dp.pt",
           "device": CPU, "votes_csv": tmp_path / "votes.csv", "log": log}
    on_dp = private_evolution(**run, out_path=tmp_path / "pe.pt", ledger_path=tmp_path / "pe.json",
                              upstream_ledgers=[str(tmp_path / "dp.json")])
    alone = private_evolution(**run, out_path=tmp_path / "pe0.pt", ledger_path=tmp_path / "pe0.json",
                              upstream_ledgers=[])
    votes_epsilon = {name: Accountant("pld").epsilon([SGMComponent(entry["noise_multiplier"], 1.0, entry["steps"])],
                                                     1e-5) for name, entry in (("on_dp", on_dp), ("alone", alone))}
    assert votes_epsilon["on_dp"] < 9.0 < 9.5 < votes_epsilon["alone"] <= 10.0, votes_epsilon
    entries = read_ledgers([tmp_path / "pe.json"])  # the teacher's entry travels in PE's ledger
    assert [e["mechanism"] for e in entries if e["private"]] == ["sgm", "gaussian"]
    result = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=10.0, num_private_records=24)
    assert result["dp_guarantee"] is True and 9.5 < result["epsilon"] <= 10.0


def test_a_teacher_of_other_classes_is_refused(tmp_path, log):
    teacher = tiny_teacher(tmp_path, log)
    settings = pe_settings(tiny_config(), {"target_epsilon": 10.0, "delta": 1e-5, "pe": {}})
    with pytest.raises(Exception, match="conditioned on 3 classes but the run has 4"):
        private_evolution(data=tiny_data(classes=4), settings=settings, labels_mode=True, teacher_path=teacher,
                          device=CPU, out_path=tmp_path / "pe.pt", ledger_path=tmp_path / "pe.json",
                          votes_csv=tmp_path / "votes.csv", upstream_ledgers=[], log=log)
    assert not (tmp_path / "pe.pt").exists()


def test_a_records_teacher_features_do_not_depend_on_the_other_records(tmp_path, log):
    """The private records' features are computed alone: adding a record changes no other record's features in
    the last bit (a batch's rounding could otherwise move a vote near a tie)."""
    from dpsad.pe.evolution import embedder

    teacher = tiny_teacher(tmp_path, log)
    embed = embedder("teacher", teacher, CPU)
    x = torch.rand(7, 1, 12, 12, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert torch.equal(embed(x, alone=True)[:6], embed(x[:6], alone=True))
    assert torch.equal(embed(x[2:3], alone=True)[0], embed(x, alone=True)[2])


def test_a_broken_candidate_takes_no_vote_and_each_record_still_casts_one():
    private = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    candidates = torch.tensor([[float("nan"), 0.0], [0.0, 0.1], [float("inf"), 1.0]])
    counts = nearest_votes(private, torch.zeros(3, dtype=torch.long), candidates, torch.zeros(3, dtype=torch.long))
    assert counts.tolist() == [0, 3, 0]
