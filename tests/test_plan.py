"""The DP plan: the dp_sizing rule (expected batch and steps from n, the budget and the compute; explicit values
win), the calibrated noise, the ledger entries, and the plan as the one place every DP training is sized and
calibrated."""

from __future__ import annotations

import ast
import logging
import math
from pathlib import Path

import pytest
import torch
import yaml

from dpsad.config import dpdm_settings, dpgan_settings, student_settings, teacher_settings
from dpsad.errors import DpsadError, PrivacyError
from dpsad.privacy.accounting import SGMComponent, Accountant, noise_for_target
from dpsad.config.resources import work_bound
from dpsad.privacy.books.ledger import components_of
from dpsad.privacy.mechanism.plan import candidate_batches, plan_dp_training, size_dp_training, sized_settings
from helpers import tiny_config, tiny_data

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "dpsad"
# The rule reads only the accountant's sigma: its tests compose with RDP (milliseconds; PLD's calibrations take
# seconds each), the demo's plan below with the demo's own accountant.
RULE = dict(example_gradients=16000, min_steps=60, target_snr=200.0, max_sample_rate=0.25, min_batch_size=16,
            accountant="rdp")


def test_the_smallest_batch_whose_signal_to_noise_reaches_the_target_is_taken():
    size = size_dp_training(4000, 10.0, 1e-5, **RULE)
    # 64 records over 250 steps give B/sigma ~ 116 < 200; 128 over 125 steps ~ 210 >= 200
    assert (size.batch_size, size.steps) == (128, 125)
    assert size.noise_multiplier == pytest.approx(noise_for_target(10.0, 1e-5, 128 / 4000, 125, "rdp"))
    assert size.batch_size / size.noise_multiplier >= 200
    smaller = noise_for_target(10.0, 1e-5, 64 / 4000, 250, "rdp")
    assert 64 / smaller < 200


def test_below_the_target_the_largest_allowed_batch_spends_the_compute_on_the_fewest_steps():
    size = size_dp_training(1000, 1.0, 1e-5, **RULE)  # B/sigma stays near 30 at any batch
    assert size.batch_size == 250 and size.steps == math.ceil(16000 / 250)  # max_sample_rate 0.25 of n
    assert "below the target" in size.reason
    capped_by_steps = size_dp_training(100000, 1.0, 1e-5, **{**RULE, "target_snr": 1e9, "min_batch_size": 256})
    assert capped_by_steps.batch_size == 16000 // 60 and capped_by_steps.steps >= 60


def test_the_size_meets_the_target_with_the_upstream_spending_composed():
    upstream = [SGMComponent(2.0, 0.01, 100)]
    size = size_dp_training(4000, 10.0, 1e-5, **RULE, fixed=upstream)
    spent = Accountant("rdp").epsilon(upstream + [SGMComponent(size.noise_multiplier, size.batch_size / 4000, size.steps)], 1e-5)
    assert spent <= 10.0 and size.batch_size * size.steps >= 16000
    alone = size_dp_training(4000, 10.0, 1e-5, **RULE)
    assert size.noise_multiplier >= alone.noise_multiplier  # what is already spent leaves more noise to add


def test_candidates_are_powers_of_two_then_the_largest():
    assert candidate_batches(250, 16) == [16, 32, 64, 128, 250]
    assert candidate_batches(6, 16) == [6]
    assert candidate_batches(6, 2) == [2, 4, 6]


def test_bad_compute_is_refused():
    with pytest.raises(ValueError, match="example_gradients = 10, expected at least min_steps = 60"):
        size_dp_training(1000, 1.0, 1e-5, **{**RULE, "example_gradients": 10})


def test_explicit_values_win_and_a_set_batch_spends_the_compute_on_steps():
    sizing = {"example_gradients": 16000, "min_steps": 60, "target_snr": 200, "max_sample_rate": 0.25,
              "min_batch_size": 16}
    base = {"dp_sizing": sizing, "dp": {"accountant": "rdp"}}  # the rule's plumbing: RDP, as RULE
    both = {**base, "batch_size": 32, "epochs": 2}
    assert sized_settings(both, "student", 4000, 10.0, 1e-5) is both
    assert sized_settings({**base, "batch_size": 64, "epochs": None}, "student", 4000, 10.0, 1e-5)["steps"] == 250
    epochs_only = sized_settings({**base, "batch_size": None, "epochs": 3}, "dpdm", 4000, 10.0, 1e-5)
    assert epochs_only["batch_size"] == 128 and epochs_only["epochs"] == 3 and "steps" not in epochs_only
    steps_only = sized_settings({**base, "batch_size": None, "epochs": None, "steps": 40}, "dpdm", 4000, 10.0, 1e-5)
    assert steps_only["steps"] == 40 and steps_only["batch_size"] == 128  # DPDM's own steps stay
    ruled = sized_settings({**base, "batch_size": None, "epochs": None}, "student", 4000, 10.0, 1e-5)
    assert (ruled["batch_size"], ruled["steps"]) == (128, 125)


def test_the_configuration_hands_each_method_its_own_compute():
    config = tiny_config()
    config["student"].update(epochs=None, batch_size=None)
    config["dp_sizing"].update(example_gradients=5000, critic_example_gradients=7000, critic_min_steps=700)
    run = {"name": "r", "method": "dpsad", "target_epsilon": 1.0, "delta": 1e-5}
    assert student_settings(config, run)["dp_sizing"]["example_gradients"] == 5000
    assert dpdm_settings(config, run)["dp_sizing"]["example_gradients"] == 5000
    assert dpdm_settings(config, run)["batch_size"] is None and dpdm_settings(config, run)["steps"] is None
    gan = dpgan_settings(config, run)
    assert gan["dp_sizing"]["critic_example_gradients"] == 7000 and "example_gradients" not in gan["dp_sizing"]
    # scheduling reads the compute, not an accountant: the rule's largest batch bounds the memory
    assert work_bound(gan, "dpgan", 4000) == (7000.0, 10)
    assert work_bound(student_settings(config, run), "student", 4000) == (5000.0, 5000 // 60)


def test_a_teacher_left_without_a_batch_is_refused():
    with pytest.raises(DpsadError, match=r"teachers.public.batch_size = null, expected a positive integer"):
        tiny_config_with_teacher_batch(None)


def tiny_config_with_teacher_batch(batch):
    from dpsad.config import validate_config

    return validate_config({
        "datasets": ["toy"], "data": {"toy": {"source": "mnist5k"}},
        "teachers": {"public": {"split": "public", "batch_size": batch}},
        "runs": [{"name": "p", "method": "public", "teacher": "public"}],
    })


def test_a_student_left_to_the_rule_trains_with_the_batch_and_steps_it_gives(tmp_path, log):
    from dpsad.privacy.books.ledger import read_ledgers
    from dpsad.training.student import train_student
    from dpsad.training.teacher import train_teacher

    config = tiny_config()
    teacher_out, teacher_ledger = tmp_path / "t.pt", tmp_path / "t.ledger.json"
    train_teacher(data=tiny_data(), settings=teacher_settings(config, "public"), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=torch.device("cpu"), out_path=teacher_out, loss_csv=tmp_path / "t.csv",
                  ledger_path=teacher_ledger, stage_name="train_teacher[public]", log=log)
    config["student"].update(epochs=None, batch_size=None)
    config["dp_sizing"].update(example_gradients=18, min_steps=3, min_batch_size=2, target_snr=1e9)
    config["student"]["dp"]["accountant"] = "rdp"  # the largest batch whatever the noise: RDP, as RULE
    settings = student_settings(config, config["runs"][0])
    train_student(data=tiny_data(), teacher_path=teacher_out, upstream_ledgers=[teacher_ledger], settings=settings,
                  labels_mode=True, device=torch.device("cpu"),
                  out_path=tmp_path / "s.pt", loss_csv=tmp_path / "s.csv", ledger_path=tmp_path / "s.ledger.json", log=log)
    (entry,) = [e for e in read_ledgers([tmp_path / "s.ledger.json"]) if e["stage"] == "distill_student"]
    # 24 records: the largest batch is min(0.25 * 24, 18 // 3) = 6, so 3 steps spend the 18 example gradients
    assert entry["sample_rate"] == pytest.approx(6 / 24) and entry["steps"] == 3


def _calls(path: Path, names: set[str]) -> set[str]:
    """The names among ``names`` that ``path`` calls (as ``f(...)`` or ``module.f(...)``), imports inside functions too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in names:
                found.add(name)
    return found


def test_only_the_plan_calibrates_noise_and_every_dp_training_is_planned():
    calibrators = {"calibrate_noise", "noise_for_target"}
    calibrating = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if _calls(path, calibrators)}
    # the accountant's own search calls itself; Private Evolution's histograms are planned in their mechanism's module
    assert calibrating == {"privacy/mechanism/plan.py", "privacy/accounting.py", "privacy/mechanism/histogram.py"}
    assert _calls(SRC / "pe" / "evolution.py", {"plan_pe"}) == {"plan_pe"}
    planned = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
               if _calls(path, {"plan_dp_training", "gaussian_release_noise"})}
    assert planned >= {"training/student.py", "training/dpdm.py", "gan/train.py", "data/central_split.py"}
    assert "sized_settings" not in {name for path in SRC.rglob("*.py") if path.name != "plan.py"
                                    for name in _calls(path, {"sized_settings"})}
    from dpsad.privacy.mechanism.code_digest import MECHANISM_MODULES

    assert {"privacy/mechanism/plan.py", "runtime/distributed.py"} <= set(MECHANISM_MODULES)  # they rerun the DP stages


@pytest.mark.e2e  # the whole demo configuration's plans, each calibrated at the accountant's resolution
def test_the_plan_gives_the_demo_the_batches_steps_and_noise_its_ledgers_recorded():
    """The values the demo's ledgers recorded before the plan was one call (n = 4,000; public teacher), the noise
    up to the search's tolerance."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    from dpsad.config import method_settings, validate_config

    config = validate_config(config)
    runs = {run["name"]: run for run in config["runs"]}
    recorded = {  # run: (q, steps, {update: sigma})
        "dpsad_eps10": (0.032, 125, {"student": 0.6400588874633644, "discriminator": 1.2801177749267287}),
        "dpsad_eps1": (0.0665, 61, {"student": 2.512167742128942, "discriminator": 5.024335484257884}),
        "dpdm_eps10": (0.032, 125, {"teacher": 0.5724860727883883}),
        "dpgan_eps10": (0.016, 1000, {"critic": 0.6268411849176354}),
    }
    for name, (q, steps, sigmas) in recorded.items():
        run = runs[name]
        method = {"dpsad": "student"}.get(run["method"], run["method"])
        shares = ({"student": 0.8, "discriminator": 0.2} if method == "student" else {next(iter(sigmas)): 1.0})
        settings = method_settings(config, run)
        if method == "student":
            assert (settings.budget_split.student, settings.budget_split.discriminator) == (0.8, 0.2)
        plan = plan_dp_training(settings, method, n=4000, upstream=[], shares=shares, stage=name)
        assert (plan.sample_rate, plan.steps) == (pytest.approx(q, rel=1e-12), steps), name
        # recorded by the bisection search before 0.3.0; the secant search ends within the same tolerance (2e-3) of
        # the smallest sigma, so the two agree within twice it
        assert plan.noise_multipliers == pytest.approx(sigmas, rel=4e-3), name
        assert plan.target_epsilon == run["target_epsilon"] and plan.delta == run["delta"]


def _plan(shares, n=400, upstream=(), **settings):
    base = {"target_epsilon": 4.0, "delta": 1e-5, "batch_size": 40, "epochs": 2, "dp": {"accountant": "pld", "clip_norm": 0.5},
            "dp_sizing": {}}
    return plan_dp_training({**base, **settings}, "student", n=n, upstream=list(upstream), shares=shares, stage="s",
                            log=logging.getLogger("t"))


def test_the_plans_entries_are_one_mechanism_per_training_and_meet_the_target():
    from dpsad.privacy.books.ledger import verdict

    plan = _plan({"student": 0.8, "discriminator": 0.2})
    assert (plan.batch_size, plan.sample_rate, plan.steps, plan.clip_norm) == (40, 0.1, 20, 0.5)
    first = plan.entries({"student": "distill_student", "discriminator": "discriminator"}, "secret")
    again = plan.entries({"student": "distill_student", "discriminator": "discriminator"}, "secret")
    assert first[0]["batch"] == first[1]["batch"] and first[0]["batch"] != again[0]["batch"]
    assert [e["noise_multiplier"] for e in first] == [plan.noise_multipliers["student"], plan.noise_multipliers["discriminator"]]
    assert "shares its Poisson batches with the discriminator" in first[0]["notes"]
    result = verdict(first, delta=1e-5, accountant="pld", target_epsilon=4.0, num_private_records=400)
    assert result["dp_guarantee"] is True and 3.9 < result["epsilon"] <= 4.0
    (alone,) = _plan({"critic": 1.0}).entries({"critic": "train_dpgan_critic"}, "secret", clip_norms={"critic": 2.0},
                                               notes={"critic": "k groups"})
    assert alone["batch"] is None and alone["clip_norm"] == 2.0 and alone["notes"] == "k groups"


def test_the_plan_composes_the_upstream_and_checks_delta_once():
    teacher = _plan({"teacher": 1.0}).entries({"teacher": "train_teacher[dp]"}, "secret")
    student = _plan({"student": 1.0}, upstream=teacher, target_epsilon=8.0)
    alone = _plan({"student": 1.0}, target_epsilon=8.0)
    assert student.upstream == tuple(components_of(teacher))
    assert student.noise_multipliers["student"] > alone.noise_multipliers["student"]  # less left to spend
    with pytest.raises(PrivacyError, match=r"delta = 0.01 is not below 1/n = 0.0025 for n = 400 private records"):
        _plan({"student": 1.0}, delta=0.01)
    with pytest.raises(PrivacyError, match="upstream components already spend"):
        _plan({"student": 1.0}, upstream=teacher, target_epsilon=3.0)
    assert _plan(None).noise_multipliers == {}  # the paper's mechanism sets its own noise


def test_every_method_reads_its_target_from_its_settings_and_no_rule_passes_it_apart():
    config = tiny_config()
    run = {"name": "r", "method": "dpsad", "target_epsilon": 3.0, "delta": 1e-6}
    for settings in (student_settings(config, run), dpdm_settings(config, run), dpgan_settings(config, run)):
        assert (settings["target_epsilon"], settings["delta"]) == (3.0, 1e-6)
    training_rules = "".join((ROOT / "workflow" / "rules" / name).read_text() for name in ("student.smk", "baselines.smk"))
    assert "target_epsilon=" not in training_rules
