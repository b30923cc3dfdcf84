"""Configuration: strict schema, defaults, one-line messages naming the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dpsad.config import deep_merge, load_config_file, run_labels, student_settings, validate_config
from dpsad.errors import DpsadError
from workflow_helpers import Wildcards

ROOT = Path(__file__).resolve().parents[1]


def minimal():
    return {
        "datasets": ["mnist5k"],
        "data": {"mnist5k": {"source": "mnist5k"}},
        "teachers": {"public": {}},
        "runs": [{"name": "dpsad_eps10", "method": "dpsad", "target_epsilon": 10}],
    }


def test_default_config_validates():
    config = load_config_file(ROOT / "config" / "config.yaml")
    assert [r["name"] for r in config["runs"]] == ["public", "nonprivate", "dpsad_eps1", "dpsad_eps10", "dpsad_kmeans_eps10",
                                                   "dpdm_eps10", "dpgan_eps10", "pe_eps1"]
    assert all(r["delta"] < 1 / 3600 for r in config["runs"])
    assert {r["name"]: run_labels(config, r) for r in config["runs"]} == {
        "public": True, "nonprivate": True, "dpsad_eps1": True, "dpsad_eps10": True, "dpsad_kmeans_eps10": "kmeans",
        "dpdm_eps10": True, "dpgan_eps10": True, "pe_eps1": True}


def test_label_sources_resolve_per_run():
    config = minimal()
    config["teachers"]["clusters"] = {"labels": "kmeans"}
    config["runs"] += [{"name": "k", "method": "dpsad", "teacher": "clusters", "target_epsilon": 10},
                       {"name": "g", "method": "dpgan", "labels": "none", "target_epsilon": 10},
                       {"name": "d", "method": "dpdm", "target_epsilon": 10, "dpdm": {"init": "clusters"}}]
    config = validate_config(config)
    runs = {r["name"]: run_labels(config, r) for r in config["runs"]}
    # a run follows its teacher (dpsad) or its warm start (dpdm); its own key wins; else the top level
    assert runs == {"dpsad_eps10": True, "k": "kmeans", "g": "none", "d": "kmeans"}


@pytest.mark.parametrize("key", ["max_iterations", "sample_steps", "min_candidates_per_class", "final_per_class",
                                 "max_candidates_per_class"])
def test_private_evolutions_integers_are_bounded(key):
    """Review: 1e9 iterations or steps hung the planner, 1e9 candidates or final images a class tried to allocate
    tens of GB."""
    config = minimal()
    config["pe"] = {key: 1_000_000_000}
    with pytest.raises(DpsadError, match=rf"pe.{key} = 1000000000"):
        validate_config(config)


@pytest.mark.parametrize(("change", "message"), [
    ({"labels": "none"}, "labels = 'none' but teacher 'public' is conditioned on labels True"),
    ({"teacher": "public", "labels": "kmeans"}, "labels = 'kmeans' but teacher 'public'"),
])
def test_a_run_on_other_labels_than_its_teacher_is_refused(change, message):
    config = minimal()
    config["runs"][0].update(change)
    with pytest.raises(DpsadError, match=message):
        validate_config(config)


def test_the_feature_teacher_must_be_public_and_not_on_kmeans_labels():
    config = minimal()
    config["teachers"]["private"] = {"split": "private"}
    config["kmeans"] = {"teacher": "private"}
    with pytest.raises(DpsadError, match="kmeans.teacher = 'private', expected a teacher trained on the public split"):
        validate_config(config)
    config = minimal()
    config["kmeans"] = {"features": "teacher"}
    with pytest.raises(DpsadError, match="kmeans.features = 'teacher' but kmeans.teacher is not set"):
        validate_config(config)


@pytest.mark.parametrize("features", ["moco", "teacher", "pixels"])
def test_k_means_labels_read_and_carry_the_ledger_of_the_moco_features_only_when_fitted_on_them(features):
    """Labels from a teacher's features or the pixels waited for MoCo's training and carried its ledger (a private
    MoCo made every run on them 'no guarantee')."""
    from dpsad.config import inputs

    config = minimal()
    config["kmeans"] = {"features": features, "teacher": "public"}
    config = validate_config(config)
    wildcards = Wildcards(dataset="mnist5k")
    given = inputs.with_upstream_ledgers(features=lambda wc: inputs.label_features(config, wc))(wildcards)
    moco = "results/mnist5k/moco/features.h5"
    assert (given["features"] == moco) is (features == "moco")
    assert ("results/mnist5k/moco/features.ledger.json" in given["upstream_ledgers"]) is (features == "moco")
    # nor does a MoCo setting enter the digest of a run on such labels (a rerun of its sampling and evaluation)
    config["runs"].append({**config["runs"][0], "name": "k", "labels": "kmeans"})
    edited = copy.deepcopy(config)
    edited["moco"]["epochs"] += 1
    run = Wildcards(dataset="mnist5k", run="k")
    assert (inputs.run_config_digest(edited, run) != inputs.run_config_digest(config, run)) is (features == "moco")


def test_defaults_are_filled():
    config = validate_config(minimal())
    assert config["diffusion"] == {"timesteps": 500, "beta_start": 1e-4, "beta_end": 0.028, "parameterization": "eps"}
    assert config["teachers"]["public"]["split"] == "public"
    assert config["student"]["dp"]["clip_norm"] == 1.0
    assert config["data"]["mnist5k"]["public_fraction"] == 0.1


def test_unknown_key_is_named():
    config = minimal()
    config["student"] = {"epochz": 3}
    with pytest.raises(DpsadError, match=r"unknown key 'epochz' at student; expected one of: .*epochs"):
        validate_config(config)


def test_bad_enum_names_key_and_choices():
    config = minimal()
    config["diffusion"] = {"parameterization": "v"}
    with pytest.raises(DpsadError, match=r"diffusion.parameterization = 'v', expected one of \['eps', 'x_prev'\]"):
        validate_config(config)


def test_out_of_range_value():
    config = minimal()
    config["data"]["mnist5k"]["public_fraction"] = 1.5
    with pytest.raises(DpsadError, match=r"data.mnist5k.public_fraction = 1.5"):
        validate_config(config)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["runs"][0].update(teacher="nope"), "teacher = 'nope'"),
        (lambda c: c["runs"][0].pop("target_epsilon"), "target_epsilon is missing"),
        (lambda c: c["runs"].append(copy.deepcopy(c["runs"][0])), "duplicate run name"),
        (lambda c: c.update(datasets=["other"]), "datasets lists 'other'"),
        (lambda c: c["runs"][0].update(student={"bogus": 1}), r"runs\[0\] \(dpsad_eps10\).student: unknown key 'bogus'"),
        (lambda c: c["data"]["mnist5k"].update(source="celeba", root="/x"), "image_size"),
        (lambda c: c["teachers"]["public"].update(privacy="dp"), "split: private"),
        (lambda c: c["runs"][0].update(name="teacher"), "name"),
        (lambda c: c["runs"].append({"name": "sweep_dpsad_eps2", "method": "dpsad", "target_epsilon": 2}),
         "run name 'sweep_dpsad_eps2' is also a sweep run's name"),
        (lambda c: c.update(sweep={"teacher": "nope"}), "sweep.teacher = 'nope'"),
        # a setting only the sweep's runs read is checked too: DPDM's warm start where no run of `runs` trains DPDM
        (lambda c: c.update(dpdm={"init": "nope"}, sweep={"methods": ["dpdm"], "epsilons": [2]}),
         r"config: sweep \(run sweep_dpdm_eps2, teacher 'public'\).dpdm.init = 'nope', expected scratch"),
        (lambda c: (c["teachers"].update(private={"split": "private"}),
                    c["runs"].append({"name": "pub", "method": "public", "teacher": "private"})),
         r"method public samples teacher 'private' trained on split 'private', expected a teacher with split: public"),
        (lambda c: c["runs"].append({"name": "pub", "method": "public", "target_epsilon": 1.0}),
         "target_epsilon = 1.0 for method public, expected none"),
        (lambda c: (c["teachers"].update(private={"split": "private"}),
                    c["runs"].append({"name": "dm", "method": "dpdm", "target_epsilon": 10, "dpdm": {"init": "private"}})),
         r"runs\[1\] \(dm\).dpdm.init = 'private': that teacher trains on split 'private'"),
        (lambda c: c["teachers"]["public"].update(init="public"), "teachers.public.init = 'public', expected scratch or the name of another"),
        (lambda c: c["teachers"].update(private={"split": "private", "init": "nope"}), "teachers.private.init = 'nope'"),
        # DPDM trains on the private split: a population named for it, globally or by a run, is read by nothing
        (lambda c: c.update(dpdm={"population": "pe_eps1"}), r"config: dpdm.population = 'pe_eps1', expected none"),
        (lambda c: c["runs"].append({"name": "dm", "method": "dpdm", "target_epsilon": 10, "dpdm": {"population": "x"}}),
         r"runs\[1\] \(dm\).dpdm.population = 'x', expected none: DPDM trains on the private split"),
    ],
)
def test_cross_checks(mutate, message):
    config = minimal()
    mutate(config)
    with pytest.raises(DpsadError, match=message):
        validate_config(config)


def test_run_overrides_merge_over_student_defaults():
    config = minimal()
    config["student"] = {"epochs": 7, "dp": {"clip_norm": 0.5}}
    config["runs"][0]["student"] = {"dp": {"accountant": "prv"}}
    config = validate_config(config)
    merged = student_settings(config, config["runs"][0])
    assert merged["epochs"] == 7 and merged["dp"]["clip_norm"] == 0.5 and merged["dp"]["accountant"] == "prv"


def test_every_shipped_config_validates():
    for path in sorted((ROOT / "config").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "datasets" not in raw or path.parent.name == "checks":  # overlays: they merge onto config.yaml
            continue
        validate_config(raw)


def test_the_checking_sets_are_overlays_of_the_default_that_release_only_the_public_row():
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    files = sorted((ROOT / "config" / "checks").glob("*.yaml"))
    assert len(files) >= 3
    kinds, sizes = set(), set()
    for path in files:
        config = validate_config(deep_merge(base, yaml.safe_load(path.read_text())))
        (name,) = config["datasets"]
        section = config["data"][name]
        assert section["release"] == ["public"] and section["earlier_use"]["description"], path.name
        kinds.add(section["source"])
        sizes.add(name)
        methods = {run["method"] for run in config["runs"]}
        assert {"public", "nonprivate", "dpsad"} <= methods, path.name
    assert len(kinds) >= 2 and len(sizes) >= 3


def test_experiment_run_files_are_valid_overlays_of_the_default_config():
    # experiments/README.md tells users to run them over `--configfile config/config.yaml config/checks/<set>.yaml`
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    files = sorted((ROOT / "experiments").glob("*.yaml"))
    assert files, "expected the experiments' run files"
    checking_sets = [deep_merge(base, yaml.safe_load((ROOT / "config" / "checks" / f"{name}.yaml").read_text()))
                     for name in ("mnist2k", "letters1k")]  # a file for letters (their two cases) runs over letters
    for path in files:
        overlay = yaml.safe_load(path.read_text())
        for checking_set in checking_sets:
            try:
                config = validate_config(deep_merge(checking_set, overlay))
                break
            except DpsadError:
                if checking_set is checking_sets[-1]:
                    raise
        names = {run["name"] for run in config["runs"]}
        # the demo's experiments share run names with the checking sets' (pe_dpt_eps1): what a file must add is a run
        assert names - {run["name"] for run in base["runs"]}, f"{path.name} adds no run to the default configuration"


def test_numbers_given_as_strings_on_the_command_line_are_coerced():
    """Snakemake's --config hands nested values over as strings ('5'); the schema's types decide."""
    config = minimal()
    config["sample"] = {"steps": "5", "eta": "0.5", "use_ema": "false"}
    config = validate_config(config)
    assert config["sample"]["steps"] == 5 and config["sample"]["eta"] == 0.5 and config["sample"]["use_ema"] is False
    config = minimal()
    config["sample"] = {"steps": "five"}
    with pytest.raises(DpsadError, match="sample.steps = 'five'"):
        validate_config(config)


def test_audit_runs_must_name_a_configured_run():
    from dpsad.config import audit_run_by_name, audit_run_names, method_settings

    config = load_config_file(ROOT / "config" / "config.yaml")
    paper = audit_run_by_name(config, "dpsad_paper_eps1")
    assert method_settings(config, paper)["mode"] == "paper"
    assert "dpsad_paper_eps1" not in [run["name"] for run in config["runs"]]  # audited, never released
    # A config that replaces runs still loads; the audit target names the missing run.
    only = load_config_file(ROOT / "config" / "config.yaml", {"runs": [config["runs"][0]]})
    with pytest.raises(DpsadError, match="audit.runs lists 'dpsad_eps10', expected a name from runs or audit.extra_runs"):
        audit_run_names(only)
    assert audit_run_names(config)[-1] == "dpsad_paper_eps1"
    clash = {"audit": {"extra_runs": [{"name": "dpsad_eps10", "method": "dpsad", "target_epsilon": 1.0}]}}
    with pytest.raises(DpsadError, match="duplicate run name 'dpsad_eps10'"):
        load_config_file(ROOT / "config" / "config.yaml", clash)


def test_the_schema_read_at_every_snakemake_start_is_the_yaml_files_mapping():
    """load_schema reads with libyaml where PyYAML has it (the schema is parsed at every Snakemake start); it must
    give exactly what the pure-Python loader gives."""
    from dpsad.config.schema import SCHEMA_PATH, load_schema

    schema = load_schema()
    assert schema == yaml.safe_load(SCHEMA_PATH.read_text()) and schema["properties"]


def test_the_schema_parsed_once_a_process_is_a_fresh_copy_each_time_and_read_again_when_edited(tmp_path):
    from dpsad.config.schema import SCHEMA_PATH, load_schema

    path = tmp_path / "schema.yaml"
    path.write_text(SCHEMA_PATH.read_text())
    first = load_schema(path)
    first["properties"].clear()  # a caller that edits what it got changes no later caller's schema
    assert load_schema(path)["properties"] and load_schema(path) == load_schema()
    path.write_text(SCHEMA_PATH.read_text().replace("title: dpsad workflow configuration", "title: edited", 1))
    assert load_schema(path)["title"] == "edited"


def test_a_pe_runs_dpdm_share_trains_its_own_dpdm_generator_to_that_share_of_its_target():
    """``pe.dpdm_share``: the run's DPDM training (warm-started from dpdm.init) spends the share, PE evolves it and
    spends the rest of the same target; without it PE evolves the run's teacher and nothing trains a DPDM model."""
    from dpsad.config import inputs
    from dpsad.config.stages import dpdm_settings, pe_settings, run_by_name, settings_for_job

    config = load_config_file(ROOT / "config" / "config.yaml")
    shared = Wildcards(dataset="mnist5k", run="pe_eps1")
    run = run_by_name(config, "pe_eps1")
    assert dpdm_settings(config, run).target_epsilon == 0.5 and pe_settings(config, run).target_epsilon == 1.0
    assert settings_for_job(config, "train_dpdm", shared) == dpdm_settings(config, run)
    assert settings_for_job(config, "train_pe", shared) == pe_settings(config, run)
    assert inputs.pe_generator(config, shared) == "results/mnist5k/pe_eps1/dpdm.pt"
    assert inputs.dpdm_init(config, shared) == ["results/mnist5k/teacher/public.pt"]
    assert inputs.generator(config, shared) == "results/mnist5k/pe_eps1/pe.pt"  # what the run samples: PE's set

    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for entry in raw["runs"]:
        entry.pop("pe", None)
    plain = validate_config(raw)
    alone = Wildcards(dataset="mnist5k", run="pe_eps1")
    assert inputs.pe_generator(plain, alone) == "results/mnist5k/teacher/public.pt"
    assert inputs.dpdm_init(plain, alone) == []
    # the plain PE run's params and digest do not name the key it left out (no rerun of existing workspaces)
    assert "dpdm_share" not in inputs.pe(plain, alone)
    assert inputs.run_config_digest(plain, alone) != inputs.run_config_digest(config, shared)


def test_a_runs_overrides_at_the_global_values_leave_its_sampling_digest_as_it_is():
    """The sample rule's params hold the run's config digest: the run's override sections written out at the global
    values, or for a section its method does not use, changed it and reran sampling and evaluation."""
    from dpsad.config import inputs

    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    written = copy.deepcopy(raw)
    entry = next(e for e in written["runs"] if e["name"] == "dpsad_eps10")
    entry["student"] = {**entry.get("student", {}), "lr": raw["student"]["lr"]}
    entry["sample"] = {"steps": raw["sample"]["steps"]}
    entry["dpgan"] = {"n_critic": 3}  # a DP-SAD run trains no dp-GAN
    wildcards = Wildcards(dataset="mnist5k", run="dpsad_eps10")
    assert inputs.run_config_digest(validate_config(written), wildcards) == \
        inputs.run_config_digest(validate_config(raw), wildcards)
    entry["sample"] = {"steps": raw["sample"]["steps"] + 1}
    assert inputs.run_config_digest(validate_config(written), wildcards) != \
        inputs.run_config_digest(validate_config(raw), wildcards)


def test_a_pe_run_evolving_its_dpdm_training_refuses_a_teacher_it_would_not_use_and_takes_dpdms_labels():
    """Review: a DP teacher named beside pe.dpdm_share was silently replaced, and the run's labels were checked
    against that unused teacher."""
    config = minimal()
    config["teachers"]["dp_half"] = {"split": "private", "privacy": "dp", "init": "public", "target_epsilon": 0.5}
    config["runs"].append({"name": "p", "method": "pe", "teacher": "dp_half", "target_epsilon": 1,
                           "pe": {"dpdm_share": 0.5}})
    with pytest.raises(DpsadError, match=r"teacher = 'dp_half' with pe.dpdm_share set, expected no teacher key"):
        validate_config(copy.deepcopy(config))
    config["runs"][-1] = {"name": "p", "method": "pe", "labels": "none", "target_epsilon": 1, "pe": {"dpdm_share": 0.5}}
    assert run_labels(validate_config(config), config["runs"][-1]) == "none"


@pytest.mark.parametrize("share", [0, 1, 1.5])
def test_a_dpdm_share_outside_zero_to_one_is_refused(share):
    config = minimal()
    config["runs"].append({"name": "p", "method": "pe", "target_epsilon": 1, "pe": {"dpdm_share": share}})
    with pytest.raises(DpsadError, match=rf"dpdm_share = {share}"):
        validate_config(config)


def test_a_count_written_as_a_float_gives_the_params_of_the_integer():
    """YAML reads 16.0 and 1.6e+4 as floats, and Snakemake compares params as text: `batch_size: 16.0` reran every
    DP student of a workspace built with 16 (and spent its budget again).  A number that may be fractional keeps
    the form it was written in, so that the params a workspace recorded stay the same."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())

    def built(overlay: dict, override: dict) -> tuple[str, dict]:
        config = deep_merge(base, overlay)
        config["runs"] = [{**run, "student": override} if run["name"] == "dpsad_eps10" else run for run in config["runs"]]
        config = validate_config(config)
        (run,) = [run for run in config["runs"] if run["name"] == "dpsad_eps10"]
        return repr(student_settings(config, run).result_view()), config

    ints, _ = built({"dp_sizing": {"example_gradients": 16000}, "model": {"channel_mult": [1, 2]},
                     "data": {"mnist5k": {"channels": 1}}}, {"batch_size": 32})
    floats, config = built({"dp_sizing": {"example_gradients": 1.6e+4}, "model": {"channel_mult": [1.0, 2.0]},
                            "data": {"mnist5k": {"channels": 1.0}}}, {"batch_size": 32.0})
    assert floats == ints
    assert "'batch_size': 32," in floats and "'example_gradients': 16000" in floats
    assert repr(config["model"]["channel_mult"]) == "[1, 2]" and repr(config["data"]["mnist5k"]["channels"]) == "1"
    for written in ("1", "1.0"):  # a number that may be fractional: as written
        assert f"'data_weight': {written}," in built({"student": {"data_weight": float(written) if "." in written
                                                                  else int(written)}}, {})[0]
    command_line = minimal()
    command_line["sample"] = {"steps": "5.0"}  # --config sample={steps: 5.0} hands the text over
    assert repr(validate_config(command_line)["sample"]["steps"]) == "5"


def test_no_shipped_configuration_writes_a_count_as_a_float(monkeypatch):
    """Counts become ints at validation, and a run's overrides take what validation made of them: a shipped file
    that wrote a count as a float, or a number as text in a run, would change the params of every workspace built
    from it, and rerun its DP stages."""
    import dpsad.config.schema as schema

    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    bases = [{}, base, *(deep_merge(base, yaml.safe_load((ROOT / "config" / "checks" / f"{name}.yaml").read_text()))
                         for name in ("mnist2k", "letters1k")),
             yaml.safe_load((ROOT / "config" / "gpu" / "mnist28.yaml").read_text()),
             yaml.safe_load((ROOT / "config" / "examples" / "no_public.yaml").read_text())]  # what each file overlays
    files = [*sorted((ROOT / "config").rglob("*.yaml")), *sorted((ROOT / "experiments").glob("*.yaml")),
             *sorted((ROOT / "tests" / "data").glob("*.yaml"))]
    assert len(files) > 10
    for path in files:
        raw = yaml.safe_load(path.read_text())
        for under in bases:
            config = deep_merge(under, raw)
            try:
                converted = repr(validate_config(copy.deepcopy(config)))
                break
            except DpsadError:
                continue
        else:
            raise AssertionError(f"{path.name} validates over none of the shipped configurations")
        with monkeypatch.context() as patch:
            patch.setattr(schema, "integers_as_int", lambda instance, *_: instance)
            patch.setattr(schema, "_take_back", lambda *_: None)
            assert repr(validate_config(copy.deepcopy(config))) == converted, path.name


def test_numbers_written_as_text_in_a_runs_overrides_are_the_numbers_its_settings_and_params_hold():
    """Audit: YAML 1.1 reads `lr: 1e-3` as text.  Validation turned it into a number in the merged copy it checked,
    but the run's settings are built from the overrides, so the text reached the job, and beside a run written
    0.001 it looked like a change that reruns the stage; `pe: {dpdm_share: 5e-1}` failed with a traceback."""
    from dpsad.config.stages import dpdm_settings, pe_settings, run_by_name

    def settings(student: dict, pe: dict) -> list[str]:
        raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
        for entry in raw["runs"]:
            entry.update({"dpsad_eps10": {"student": student}, "pe_eps1": {"pe": pe}}.get(entry["name"], {}))
        config = validate_config(raw)
        dpsad, pe_run = run_by_name(config, "dpsad_eps10"), run_by_name(config, "pe_eps1")
        return [repr(s.result_view()) for s in (student_settings(config, dpsad), dpdm_settings(config, pe_run),
                                                pe_settings(config, pe_run))]

    as_text = settings(yaml.safe_load("{lr: 1e-3, batch_size: '16', init_from_teacher: 'true'}"),
                       yaml.safe_load("{dpdm_share: 5e-1}"))
    assert as_text == settings({"lr": 0.001, "batch_size": 16, "init_from_teacher": True}, {"dpdm_share": 0.5})
    assert "'lr': 0.001," in as_text[0] and "'target_epsilon': 0.5," in as_text[1]
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    shared = {"steps": 100.0, "target_epsilon": 3}  # one YAML anchor in two runs: run_section's keys stay as given
    for entry in raw["runs"]:
        if entry["name"] in ("dpdm_eps10", "pe_eps1"):
            entry["dpdm"] = shared
    validate_config(raw)
    assert repr(shared) == "{'steps': 100, 'target_epsilon': 3}"
