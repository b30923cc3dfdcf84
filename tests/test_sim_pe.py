"""Sim-PE (``pe.simulator``): Private Evolution over the public font renderer's parameters."""

from __future__ import annotations

import ast
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import tiny_config, tiny_data
from workflow_helpers import planned_jobs, resource_lines, snakemake

from dpsad.card import method_kind
from dpsad.config import inputs, pe_settings, teacher_settings, validate_config
from dpsad.data.datafile import Split
from dpsad.data.font_glyphs import DISTORTIONS, render_font_glyphs
from dpsad.errors import DpsadError
from dpsad.pe import PE_KIND, simulator_evolution
from dpsad.pe.font_simulator import FontSimulator, GlyphParams, reflect_unit
from dpsad.privacy.books.ledger import make_entry, read_ledgers, verdict, write_ledger
from dpsad.privacy.books.preparation import RECORDS, RECORDS_ID, new_records_id
from dpsad.privacy.mechanism import code_digest
from dpsad.sampling.draw import load_any_generator
from dpsad.synthetic import load_synthetic
from dpsad.training.teacher import train_teacher

CPU = torch.device("cpu")
DIGITS = {"source": "font_digits", "n_per_class": 20}


def public_draws(chars: str, n_per_class: int, seed: int) -> GlyphParams:
    """The parameters the public renderer draws for ``render_font_glyphs(chars, n_per_class, seed)``, in its order."""
    rng, count = np.random.default_rng(seed), len(chars) * n_per_class
    font, weight, box, unit, fields = [], [], [], [], []
    n_fonts = len(FontSimulator(chars, 28, 0).fonts)
    for _ in range(count):
        font.append(int(rng.integers(n_fonts)))
        weight.append(DISTORTIONS["weights"].index(int(rng.choice(DISTORTIONS["weights"]))))
        box.append(DISTORTIONS["box_sizes"].index(int(rng.choice(DISTORTIONS["box_sizes"]))))
        angle, shear = rng.uniform(-DISTORTIONS["rotation"], DISTORTIONS["rotation"]), rng.uniform(-0.5, 0.5)
        zoom = rng.uniform(1.0 - DISTORTIONS["scale"], 1.0 + DISTORTIONS["scale"])
        unit.append([(angle / DISTORTIONS["rotation"] + 1) / 2, (shear / DISTORTIONS["shear"] + 1) / 2,
                     ((zoom - 1.0) / DISTORTIONS["scale"] + 1) / 2])
        # the renderer's uniform fields in the simulator's units: unit variance (a uniform on [-1, 1] has 1/3)
        fields.append(np.stack([rng.uniform(-1, 1, (28, 28)), rng.uniform(-1, 1, (28, 28))]) * np.sqrt(3.0))
    labels = np.repeat(np.arange(len(chars)), n_per_class)
    return GlyphParams(labels=labels, font=np.array(font), weight=np.array(weight), box=np.array(box),
                       unit=np.array(unit), fields=np.array(fields), form=np.zeros(count, dtype=np.int64))


def test_the_simulator_renders_the_public_sources_own_images_from_their_parameters():
    """Sim-PE searches the public source's own space: the renderer's parameters reproduce its images."""
    images, _, _ = render_font_glyphs("0123456789", 2, seed=3)
    rendered = FontSimulator("0123456789", 28, 0).render(public_draws("0123456789", 2, seed=3))
    assert rendered.shape == (20, 1, 28, 28) and rendered.min() >= -1 and rendered.max() <= 1
    as_uint8 = ((rendered[:, 0] + 1) * 127.5).round().numpy().astype(np.int64)
    assert np.abs(as_uint8 - images.astype(np.int64)).max() <= 1  # the angle's round trip moves a pixel by a level


def test_candidates_sharing_a_glyph_render_as_each_would_alone():
    """The simulator draws and centres each (font, glyph, weight, box) once: candidates that share one still render
    exactly as each does by itself, in a simulator that has drawn nothing yet."""
    simulator = FontSimulator("ab", 16, seed=0)
    shared = simulator.fresh(np.zeros(6, dtype=np.int64))
    for name in ("font", "weight", "box", "form"):
        getattr(shared, name)[:] = getattr(shared, name)[0]
    together = simulator.render(shared)
    alone = [FontSimulator("ab", 16, seed=0).render(GlyphParams(**{
        name: value[i:i + 1] for name, value in vars(shared).items()})) for i in range(6)]
    assert torch.equal(together, torch.cat(alone)) and torch.equal(simulator.render(shared), together)
    assert len(simulator._centred) == 1 and len({bytes(image.numpy()) for image in together}) == 6


def test_a_variation_keeps_the_class_stays_in_range_and_moves_further_the_stronger_it_is():
    simulator = FontSimulator("abc", 16, seed=0)
    parents = simulator.fresh(np.repeat(np.arange(3), 30))
    images = simulator.render(parents)
    assert images.shape == (90, 1, 16, 16)
    distance = {}
    for strength in (0.1, 1.0):
        child = simulator.vary(parents, strength)
        assert np.array_equal(child.labels, parents.labels)
        assert child.unit.min() >= 0 and child.unit.max() <= 1
        distance[strength] = float((simulator.render(child) - images).abs().mean())
    fresh = float((simulator.render(simulator.fresh(parents.labels)) - images).abs().mean())
    assert 0 < distance[0.1] < distance[1.0] <= fresh * 1.2
    assert np.allclose(reflect_unit(np.array([-0.25, 0.5, 1.25, 2.5])), [0.25, 0.5, 0.75, 0.5])
    with pytest.raises(DpsadError, match="strength = 0"):
        simulator.vary(parents, 0.0)


def test_with_both_cases_a_candidates_glyph_is_its_letter_in_either_case_and_digits_draw_as_before():
    """``simulator_cases: both``: the glyph is one more parameter, drawn and varied like the font; a candidate of form
    1 renders as the other case's renderer renders it.  Where no class has two cases (digits), both settings draw the
    same parameters, so a run that leaves the key out keeps its candidates."""
    labels = np.repeat(np.arange(3), 40)
    both = FontSimulator("ABC", 16, seed=4, cases="both")
    assert both.glyphs == [("A", "a"), ("B", "b"), ("C", "c")]
    parents = both.fresh(labels)
    assert set(parents.form.tolist()) == {0, 1}
    lower = parents.take(np.flatnonzero(parents.form == 1))
    as_public_lower = GlyphParams(**{**vars(lower), "form": np.zeros_like(lower.form)})
    assert torch.equal(both.render(lower), FontSimulator("abc", 16, seed=0).render(as_public_lower))
    assert not torch.equal(both.render(lower), FontSimulator("ABC", 16, seed=0).render(as_public_lower))
    child = both.vary(parents, 1.0)
    assert np.array_equal(child.labels, parents.labels) and 0 < (child.form != parents.form).mean() < 1
    assert (both.vary(parents, 0.02).form != parents.form).mean() < (child.form != parents.form).mean()
    draws = {}
    for cases in ("public", "both"):
        digits = FontSimulator("0123456789", 16, seed=4, cases=cases)
        first = digits.fresh(np.arange(10))
        draws[cases] = (first, digits.vary(first, 0.5))
    for one, other in zip(draws["public"], draws["both"]):
        assert all(np.array_equal(getattr(one, name), getattr(other, name)) for name in vars(one))
    assert not FontSimulator("ABC", 16, seed=4).fresh(labels).form.any()  # public: the source's case only
    with pytest.raises(DpsadError, match="cases = 'lower', expected one of public, both"):
        FontSimulator("ABC", 16, seed=0, cases="lower")


def test_with_both_cases_the_votes_take_sim_pe_to_the_private_records_other_case(tmp_path, log):
    """Private lower-case letters beside an upper-case public renderer: at a large budget the votes choose the
    candidates of the records' case (half of the first draw), so most of the population is lower-case; with the
    public case alone none is."""
    images, classes, _ = render_font_glyphs("abcdefghij", 8, seed=5)
    data = tiny_data(n_train=80, size=28, classes=10)
    data.splits["train"] = Split(images[..., None], classes)
    data.class_names[:] = list("abcdefghij")
    data.attrs[RECORDS_ID] = new_records_id()
    letters = {"source": "font_letters", "case": "upper", "n_per_class": 20}
    lower_share = {}
    for cases in ("public", "both"):
        simulator_evolution(data=data, settings=sim_settings(target=1000.0, final_per_class=10, votes_per_noise=1.0,
                                                             simulator_cases=cases),
                            labels_mode=True, public_source=letters, teacher_path=None, device=CPU,
                            out_path=tmp_path / "pe.pt", ledger_path=tmp_path / "pe.json",
                            votes_csv=tmp_path / "votes.csv", upstream_ledgers=[], log=log)
        glyphs = torch.load(tmp_path / "pe.pt", weights_only=False)["glyphs"]
        assert len(glyphs) == 100 and set(glyphs.lower()) == set("abcdefghij")
        lower_share[cases] = sum(char.islower() for char in glyphs) / len(glyphs)
    assert lower_share["public"] == 0 and lower_share["both"] > 0.65, lower_share


def sim_settings(target=10.0, **pe):
    """Sim-PE's settings for the tests, RDP's accountant: its Gaussian compositions take microseconds where PLD's
    take a tenth of a second each, and the plan searches dozens (PE's tests cover PLD)."""
    return pe_settings(tiny_config(), {"target_epsilon": target, "delta": 1e-5,
                                       "pe": {"simulator": True, "final_per_class": 3, "dp": {"accountant": "rdp"},
                                              **pe}}).as_dict()


def test_a_sim_pe_run_writes_a_population_of_renders_whose_ledger_composes_to_the_target(tmp_path, log):
    data = tiny_data(n_train=60, size=16, classes=10)
    data.attrs[RECORDS_ID] = new_records_id()
    entry = simulator_evolution(data=data, settings=sim_settings(), labels_mode=True, public_source=DIGITS,
                                teacher_path=None, device=CPU, out_path=tmp_path / "pe.pt",
                                ledger_path=tmp_path / "pe.json", votes_csv=tmp_path / "votes.csv",
                                upstream_ledgers=[], log=log)
    assert entry["mechanism"] == "gaussian" and entry["private"] and entry["noise_seed"] == "secret"
    assert entry[RECORDS] == data.attrs[RECORDS_ID] and read_ledgers([tmp_path / "pe.json"]) == [entry]  # stamped
    result = verdict(read_ledgers([tmp_path / "pe.json"]), delta=1e-5, accountant="rdp", target_epsilon=10.0,
                     num_private_records=60)
    assert result["dp_guarantee"] is True and 9.5 < result["epsilon"] <= 10.0
    state = torch.load(tmp_path / "pe.pt", weights_only=False)
    assert state["kind"] == PE_KIND and state["images"].shape == (30, 16, 16, 1)
    assert np.bincount(state["labels"]).tolist() == [3] * 10 and state["ledger"] == [entry]
    assert state["images"].max() > 200  # ink: rendered glyphs, not the private noise images' copies
    draw, names = load_any_generator(tmp_path / "pe.pt", CPU)
    images, labels = draw({"n_per_class": 2, "n_samples": None, "batch_size": 4}).collect()
    assert names == [str(d) for d in range(10)] and images.shape == (20, 16, 16, 1)
    assert len((tmp_path / "votes.csv").read_text().splitlines()) == entry["steps"] + 1
    assert method_kind("pe", {"components": [entry]}) == "pe on the public renderer"  # the card names it


def test_sim_pe_voting_in_a_teachers_features_composes_the_teachers_ledger_into_its_plan(tmp_path, log):
    """``embedding: teacher``: the records vote in a teacher's features, so its ledger is upstream of the votes: the
    plan spends only what it left, and the written ledger composes both to the target.  The upstream spending is a
    plain Gaussian entry standing in for a DP teacher's (it composes in milliseconds; the path is the same)."""
    config, data = tiny_config(), tiny_data(n_train=30, size=16, classes=10)
    train_teacher(data=data, settings=teacher_settings(config, "public"), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=CPU, out_path=tmp_path / "t.pt", loss_csv=tmp_path / "t.csv",
                  ledger_path=tmp_path / "t.json", stage_name="train_teacher", log=log)
    spent = make_entry(stage="train_teacher", private=True, mechanism="gaussian", sample_rate=1.0, noise_multiplier=1.0,
                       steps=1, clip_norm=1.0, noise_seed="secret")
    write_ledger(tmp_path / "dp.json", [spent], upstream=[tmp_path / "t.json"])
    entry = simulator_evolution(data=data, settings=sim_settings(embedding="teacher"), labels_mode=True,
                                public_source=DIGITS, teacher_path=tmp_path / "t.pt", device=CPU,
                                out_path=tmp_path / "pe.pt", ledger_path=tmp_path / "pe.json",
                                votes_csv=tmp_path / "votes.csv", upstream_ledgers=[str(tmp_path / "dp.json")], log=log)
    ledger = read_ledgers([tmp_path / "pe.json"])
    assert spent in ledger and entry in ledger and entry["stage"] == "sim_pe"
    result = verdict(ledger, delta=1e-5, accountant="rdp", target_epsilon=10.0, num_private_records=30)
    assert result["dp_guarantee"] is True and 9.5 < result["epsilon"] <= 10.0
    alone = verdict([entry], delta=1e-5, accountant="rdp", target_epsilon=10.0, num_private_records=30)
    assert alone["epsilon"] < 9.0  # the votes alone spend only what the upstream spending left


@pytest.mark.parametrize("labels_mode, source, classes, message", [
    ("kmeans", DIGITS, 10, "expected labels: true"),
    (True, {"source": "mnist5k"}, 10, "expected font_digits or font_letters"),
    (True, None, 10, "no separate public source"),
    (True, DIGITS, 3, "are not the public renderer's"),
])
def test_a_sim_pe_run_refuses_classes_the_renderer_cannot_draw(tmp_path, log, labels_mode, source, classes, message):
    with pytest.raises(DpsadError, match=message):
        simulator_evolution(data=tiny_data(n_train=30, size=16, classes=classes), settings=sim_settings(),
                            labels_mode=labels_mode, public_source=source, teacher_path=None, device=CPU,
                            out_path=tmp_path / "pe.pt", ledger_path=tmp_path / "pe.json",
                            votes_csv=tmp_path / "votes.csv", upstream_ledgers=[], log=log)
    assert not (tmp_path / "pe.pt").exists() and not (tmp_path / "pe.json").exists()


def sim_config(public=DIGITS, labels=True, **run):
    return {"datasets": ["toy"], "data": {"toy": {"source": "mnist5k", "public": public}},
            "labels": labels, "teachers": {"public": {"split": "public", "steps": 6, "batch_size": 4}},
            "runs": [{"name": "sim", "method": "pe", "target_epsilon": 1.0, "pe": {"simulator": True}, **run}]}


def test_the_config_refuses_a_sim_pe_run_without_a_font_source_true_labels_or_with_a_dpdm_generator():
    config = validate_config(sim_config())
    wildcards = SimpleNamespace(dataset="toy", run="sim")
    assert inputs.pe_generator(config, wildcards) == []  # pixels: no model is read, none is trained
    teacher_embedding = validate_config(sim_config(pe={"simulator": True, "embedding": "teacher"}))
    assert inputs.pe_generator(teacher_embedding, wildcards) == "results/toy/teacher/public.pt"
    for bad, message in [(sim_config(public={"source": "mnist5k"}), "public.source = 'mnist5k', expected one of"),
                         (sim_config(labels="none"), "expected labels: true"),
                         (sim_config(pe={"simulator": True, "dpdm_share": 0.5}), "with pe.dpdm_share set"),
                         (sim_config(pe={"simulator": True, "simulator_cases": "both"}),
                          "simulator_cases: both but data.toy.public.source = 'font_digits', expected font_letters"),
                         (sim_config(pe={"simulator": True, "simulator_cases": "upper"}), "upper")]:
        with pytest.raises(DpsadError, match=message):
            validate_config(bad)


def test_sim_pe_has_its_own_mechanism_digest_so_choosing_it_reruns_no_other_pe_run():
    assert code_digest.sim_pe_code_sha256() != code_digest.pe_code_sha256()
    # the digest covers every module of PE's own package the loop imports (PE's embedder and draw among them), the
    # renderer aside: it reads no record
    loop = code_digest.PACKAGE / "pe" / "simulator_evolution.py"
    siblings = {f"pe/{node.module}.py" for node in ast.walk(ast.parse(loop.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level == 1}
    assert "pe/evolution.py" in siblings and siblings - {"pe/font_simulator.py"} <= set(code_digest.SIM_PE_MODULES)
    assert "pe/simulator_evolution.py" in code_digest.SIM_PE_MODULES
    plain = pe_settings(tiny_config(), {"target_epsilon": 1.0, "delta": 1e-5}).as_dict()
    assert "simulator" not in plain  # absent from a PE run's params: adding the key to the schema reran nothing
    # the glyph's cases: in a Sim-PE run's params where set; a generator's PE run reads none, so they rerun nothing
    cases = {"simulator_cases": "both"}
    for pe, changes in (({"simulator": True}, True), ({}, False)):
        unset = pe_settings(tiny_config(), {"target_epsilon": 1.0, "delta": 1e-5, "pe": pe}).result_view()
        both = pe_settings(tiny_config(), {"target_epsilon": 1.0, "delta": 1e-5, "pe": {**pe, **cases}}).result_view()
        assert (both != unset) is changes and ("simulator_cases" in both) is changes


def test_every_privacy_module_the_pe_loops_import_is_in_their_mechanism_digest():
    """A change to how PE's entry is written or its upstream read (``privacy/books/ledger.py``) must rerun PE."""
    for loop, modules in (("pe/evolution.py", code_digest.PE_MODULES),
                          ("pe/simulator_evolution.py", code_digest.SIM_PE_MODULES)):
        tree = ast.parse((code_digest.PACKAGE / loop).read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module == "privacy":  # privacy.accounting
                imported |= {f"privacy/{alias.name}.py" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 2 and (node.module or "").startswith("privacy."):
                imported.add(node.module.replace(".", "/") + ".py")
        assert imported and imported <= set(modules), f"{loop}: {sorted(imported - set(modules))} not in its digest"


@pytest.mark.e2e
def test_a_sim_pe_run_of_the_workflow_reads_no_model_and_states_its_votes_alone(tiny_run, tmp_path):
    """Through Snakemake, as a user adds it: a pixel Sim-PE run trains and reads no model (no teacher job, no
    upstream ledger), and its privacy.json and synthetic set hold the votes' spending alone."""
    cwd = tmp_path / "copy"
    shutil.copytree(tiny_run, cwd, symlinks=True)  # the prepared data and Snakemake's records: only the new run runs
    overlay = tmp_path / "simpe.yaml"
    overlay.write_text("data: {mnist5k: {release: [public]}}\nruns:\n  - {name: public, method: public, teacher: public}\n"
                       "  - {name: simpe_eps10, method: pe, target_epsilon: 10.0, pe: {simulator: true}}\n")
    target = "results/mnist5k/simpe_eps10/synthetic.h5"
    config = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", str(overlay))
    planned = snakemake(cwd, target, "-n", *config, "--config", "gpus_per_job=1")
    assert planned_jobs(planned) == {"train_pe": 1, "account": 1, "sample": 1}
    assert resource_lines(planned)["train_pe"][0]["gpu"] == "0"  # it renders on the CPU: no GPU to queue for
    assert resource_lines(planned)["sample"][0]["gpu"] == "1"
    snakemake(cwd, target, "--cores", "2", *config)
    privacy = json.loads((cwd / "results" / "mnist5k" / "simpe_eps10" / "privacy.json").read_text())
    assert privacy["dp_guarantee"] is True and 9.5 < privacy["epsilon"] <= 10.0
    assert [(c["stage"], c["mechanism"], c["private"]) for c in privacy["components"]] == [("sim_pe", "gaussian", True)]
    synthetic = load_synthetic(cwd / target)
    assert synthetic.images.shape == (20, 16, 16, 1) and synthetic.attrs["method"] == "pe"
