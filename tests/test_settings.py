"""Typed settings: one class a training method, its fields the schema's keys, execution-only fields marked on
the class and out of the rule's params, and the script's object built by the same function as the params."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from dpsad.config import (
    DpdmSettings,
    DpganSettings,
    DpTraining,
    PeSettings,
    Settings,
    StudentSettings,
    TeacherSettings,
    dpdm_settings,
    dpgan_settings,
    load_schema,
    pe_settings,
    settings_for_job,
    student_settings,
    teacher_settings,
    validate_config,
)
from dpsad.config.settings import (ABSENT, DEFAULT_EMA_WARMUP, OPTIONAL, BudgetSplit, Discriminator, PeDp, execution_only_names, means_absent,
                                   sized)
from dpsad.errors import DpsadError
from dpsad.jobs.stage import inputs_sha256, stage_settings

ROOT = Path(__file__).resolve().parents[1]
RUN_FIELDS = {"target_epsilon", "delta"}


@pytest.fixture(scope="module")
def config() -> dict:
    return validate_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))


def run_of(method: str, **extra) -> dict:
    return {"name": f"{method}_x", "method": method, "teacher": "public", "target_epsilon": 10.0, "delta": 1e-5,
            "student": {}, "dpdm": {}, "dpgan": {}, "pe": {}, "sample": {}, **extra}


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - {"inputs_sha256"}


def test_every_class_has_exactly_the_keys_of_its_schema_section():
    defs = load_schema()["$defs"]
    keys = {name: set(section["properties"]) for name, section in defs.items() if "properties" in section}
    assert names(TeacherSettings) == keys["teacher"]
    assert names(DpdmSettings) == keys["teacher"] | {"dp_sizing"}
    assert names(StudentSettings) == keys["student"] | RUN_FIELDS | {"dp_sizing"}
    assert names(DpganSettings) == keys["dpgan"] | RUN_FIELDS | {"dp_sizing"}
    assert names(PeSettings) == keys["pe"] | RUN_FIELDS
    assert names(DpTraining) == keys["dp_training"]
    assert names(PeDp) == set(defs["pe"]["properties"]["dp"]["properties"])
    assert names(Discriminator) == set(defs["student"]["properties"]["discriminator"]["properties"])
    assert names(BudgetSplit) == set(defs["student"]["properties"]["budget_split"]["properties"])


def test_the_execution_only_fields_are_marked_on_the_classes():
    how = ["microbatch_size", "per_example", "precision"]
    for cls in (TeacherSettings, DpdmSettings, StudentSettings, DpganSettings):
        assert execution_only_names(cls) == {"": ["checkpoint_every"], "dp": how}, cls
    assert execution_only_names(PeSettings) == {}


def test_the_demos_dp_batches_run_in_one_chunk_of_the_default_microbatch(config):
    """A Poisson batch a few over the microbatch runs as a full chunk and a small one, whose fixed costs a step pays
    again (on 2 CPU cores the demo's DP steps took 1.1-1.2x as long with microbatch 256 as with 512): the largest
    batch the sizing rule may give the demo's student and DPDM, and six standard deviations more, fit in one chunk."""
    from dpsad.config.resources import configured_shape, work_bound

    private = configured_shape(config["data"][config["datasets"][0]]).private
    for method, settings in (("student", student_settings(config, run_of("dpsad"))),
                             ("dpdm", dpdm_settings(config, run_of("dpdm")))):
        batch = work_bound(settings, method, private)[1]
        assert batch + 6 * batch ** 0.5 <= settings.dp.microbatch_size, (method, batch, settings.dp.microbatch_size)


def built(config) -> list[Settings]:
    return [teacher_settings(config, "public"), student_settings(config, run_of("dpsad")),
            dpdm_settings(config, run_of("dpdm")), dpgan_settings(config, run_of("dpgan")), pe_settings(config, run_of("pe"))]


def scalar_changes(settings: Settings, prefix=()):
    """(path, a copy of ``settings`` with one scalar field changed) for every scalar field, nested ones too."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, Settings):
            for path, changed in scalar_changes(value, prefix + (f.name,)):
                yield path, dataclasses.replace(settings, **{f.name: changed})
            continue
        if f.name == "inputs_sha256" or isinstance(value, dict):
            continue
        other = (not value if isinstance(value, bool) else value + 1 if isinstance(value, (int, float))
                 else f"{value}_other" if isinstance(value, str) else 7)
        yield prefix + (f.name,), dataclasses.replace(settings, **{f.name: other})


def test_a_result_field_changes_the_params_and_an_execution_only_one_never_does(config):
    for settings in built(config):
        marked = execution_only_names(type(settings))
        seen = 0
        for path, changed in scalar_changes(settings):
            unused = settings.unused_keys()
            execution = (path[-1] in marked.get(".".join(path[:-1]), []) or path[0] in unused
                         or ".".join(path[:2]) in unused)
            assert (changed.result_view() == settings.result_view()) == execution, (type(settings).__name__, path)
            assert changed.as_dict() != settings.as_dict(), path  # the resume digest sees every field
            seen += 1
        assert seen >= 10


def test_keys_a_dp_training_does_not_read_are_not_in_its_params(config):
    """Editing them reran the DP stage and spent its budget again: ``dp_sizing`` where batch and length are set (all
    but its compute where the batch alone is), and the paper mechanism's keys in ``mode: sound``.  Where the
    training reads them they stay."""
    sound = student_settings(config, run_of("dpsad"))
    assert sound.mode == "sound" and {"paper_noise_multiplier", "allow_unsound"}.isdisjoint(sound.result_view())
    paper = student_settings(config, run_of("dpsad", student={"mode": "paper", "allow_unsound": True}))
    assert {"paper_noise_multiplier", "allow_unsound"} <= set(paper.result_view())
    for settings_of, method, given in ((student_settings, "dpsad", {"student": {"batch_size": 64, "epochs": 5}}),
                                      (dpgan_settings, "dpgan", {"dpgan": {"batch_size": 64, "epochs": 5}}),
                                      (dpdm_settings, "dpdm", {"dpdm": {"batch_size": 64, "epochs": 5}})):
        fixed, rule = settings_of(config, run_of(method, **given)), settings_of(config, run_of(method))
        assert "dp_sizing" not in fixed.result_view() and "dp_sizing" in fixed.as_dict(), method
        assert "dp_sizing" in rule.result_view(), method  # the shipped sections leave the size to the rule
        only_batch = settings_of(config, run_of(method, **{k: {"batch_size": 64} for k in given}))
        compute = "critic_example_gradients" if method == "dpgan" else "example_gradients"
        # the steps spend the rule's compute: its one key stays, the others (target_snr, min_steps, ...) leave
        assert only_batch.result_view()["dp_sizing"] == {compute: config["dp_sizing"][compute]}, method


def test_the_views_are_plain_sorted_dicts_without_unset_optional_keys(config, tmp_path):
    teacher = teacher_settings(config, "public")
    assert teacher.trainable is None and "trainable" not in teacher.result_view() and "trainable" not in teacher
    with_adapters = dataclasses.replace(teacher, trainable="lora", lora_rank=4)
    assert with_adapters.result_view()["trainable"] == "lora" and with_adapters.result_view()["lora_rank"] == 4
    # an option added later (the EMA's warm-up) is left out unless set: no existing DP stage reruns for it
    assert "ema_warmup" not in teacher.result_view()
    assert "ema_warmup" not in student_settings(config, run_of("dpsad")).result_view()
    assert student_settings(config, run_of("dpsad", student={"ema_warmup": 4})).result_view()["ema_warmup"] == 4
    view = student_settings(config, run_of("dpsad")).as_dict()
    assert list(view) == sorted(view) and list(view["dp"]) == sorted(view["dp"])

    def plain(value):
        return (isinstance(value, dict) and type(value) is dict and all(plain(v) for v in value.values())
                or not isinstance(value, (Settings, tuple)))
    assert plain(view)
    torch.save({"settings": view}, tmp_path / "c.pt")  # a checkpoint loads without this module's classes
    assert torch.load(tmp_path / "c.pt", weights_only=True)["settings"] == view


def optional_fields(settings: Settings, prefix: tuple[str, ...] = ()):
    """(path, field) of every optional key of ``settings``, nested sections included."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, Settings):
            yield from optional_fields(value, prefix + (f.name,))
        elif f.metadata.get(OPTIONAL):
            yield prefix + (f.name,), f


# A value of each optional key that differs from what its absence means (and passes the schema)
OTHER_VALUE = {"subspace": True, "ema_warmup": 2, "trainable": "lora", "lora_rank": 8, "dpdm_share": 0.5,
               "simulator": True, "simulator_cases": "both", "population": "pe_eps1"}


def test_an_optional_key_written_out_at_what_its_absence_means_leaves_the_params_as_without_it(config):
    """``dp.subspace: false``, ``trainable: all``, ``lora_rank: null``... give the params of the key left out:
    the DP stage computes the same, so it must not train and spend again.  Any other value is a change."""
    settings_of = {"dpsad": student_settings, "dpdm": dpdm_settings, "dpgan": dpgan_settings, "pe": pe_settings}
    seen, changes = set(), set()
    for method, build in settings_of.items():
        section = {"dpsad": "student"}.get(method, method)
        unset = build(config, run_of(method))
        for path, f in optional_fields(unset):
            seen.add(path[-1])
            for value in {None, f.metadata[ABSENT]}:
                local = copy.deepcopy(config)
                node = local[section]
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = value
                try:
                    local = validate_config(local)
                except DpsadError:
                    assert value is None, (method, path, value)  # null may be refused; the absence's value never
                    continue
                written = build(local, run_of(method))
                overridden = build(config, run_of(method, **{section: nested(path, value)}))  # a run's override alike
                for each in (written, overridden):
                    assert each.result_view() == unset.result_view(), (method, path, value)
                    assert each.as_dict() == unset.as_dict() and set(each) == set(unset), (method, path, value)
            try:
                changed = build(config, run_of(method, **{section: nested(path, OTHER_VALUE[path[-1]])}))
            except DpsadError:  # dpgan.dp.subspace: true is refused
                continue
            if path[-1] in changed.unused_keys():  # a key this run does not read (simulator_cases beside a generator)
                assert changed.result_view() == unset.result_view(), (method, path)
            else:
                assert changed.result_view() != unset.result_view(), (method, path)
            changes.add(path[-1])
    assert seen == changes == set(OTHER_VALUE), (seen, changes)  # every optional key of the schema was tried
    assert not means_absent(0, False) and not means_absent(10.5, 10) and means_absent(10, 10)
    # the schema's words for ema_warmup's absence are the value the EMA reads it as
    assert f"(absent: {DEFAULT_EMA_WARMUP})" in load_schema()["$defs"]["ema_warmup"]["description"]


def nested(path: tuple[str, ...], value) -> dict:
    """{path[0]: {path[1]: ... value}}: a run's override of one key."""
    for key in reversed(path):
        value = {key: value}
    return value


def test_the_mapping_view_is_the_section_the_plan_read_before(config):
    """plan.sized_settings and Private Evolution read a section by key: the view holds exactly the keys set."""
    for settings in built(config):
        assert set(settings) == set(settings.as_dict()) and len(settings) == len(settings.as_dict())
        for key in settings:
            value = settings[key]
            assert (value.as_dict() if isinstance(value, Settings) else value) == settings.as_dict()[key], key
    pe = dataclasses.replace(pe_settings(config, run_of("pe")), inputs_sha256="ab")
    assert pe.as_dict()["inputs_sha256"] == "ab" and "given" not in pe.as_dict()


def test_the_privacy_layer_reads_a_section_by_key_as_before(config):
    settings = dpdm_settings(config, run_of("dpdm"))
    assert settings["dp"]["accountant"] == settings.dp.accountant and settings["dp_sizing"] is settings.dp_sizing
    assert dict(settings)["batch_size"] is None and settings.get("epochs") is None
    assert settings.get("trainable", "all") == "all"  # unset optional keys are absent, as in the YAML
    with pytest.raises(KeyError):
        settings["no_such_key"]
    planned = {**dict(settings), "batch_size": 96, "steps": 40}
    assert (sized(settings, planned).batch_size, sized(settings, planned).steps) == (96, 40)
    student = student_settings(config, run_of("dpsad"))
    assert sized(student, {**dict(student), "batch_size": 12, "steps": 5}).batch_size == 12  # no steps field: kept out


def test_a_bad_section_is_a_one_line_error(config):
    section = dict(config["pe"], target_epsilon=1.0, delta=1e-5)
    with pytest.raises(DpsadError, match=r"config: pe: unknown key 'votes' for PeSettings, expected one of"):
        PeSettings.from_section({**section, "votes": 3}, "config: pe")
    del section["eta"]
    with pytest.raises(DpsadError, match=r"config: pe: PeSettings lacks eta, expected a section validated"):
        PeSettings.from_section(section, "config: pe")


def test_a_run_override_reaches_the_object_and_its_params(config):
    run = run_of("dpsad", student={"lr": 3e-4, "dp": {"microbatch_size": 8}})
    settings = student_settings(config, run)
    assert settings.lr == 3e-4 and settings.dp.microbatch_size == 8 and settings.dp.clip_norm == config["student"]["dp"]["clip_norm"]
    assert settings.result_view() == dataclasses.replace(settings, dp=dataclasses.replace(settings.dp, microbatch_size=64)).result_view()


def fake_job(config, rule, wildcards, params_settings, inputs):
    return SimpleNamespace(config=config, rule=rule, wildcards=wildcards, input=inputs,
                           params=SimpleNamespace(settings=params_settings))


def test_the_script_gets_the_whole_object_the_rule_params_came_from(config, tmp_path):
    data = tmp_path / "data.h5"
    data.write_bytes(b"records")
    local = copy.deepcopy(config)
    local["runs"].append(run_of("dpgan", name="dpgan_local", dpgan={"checkpoint_every": 9}))
    for rule in ("train_dpgan", "dpsad_train_dpgan"):  # a host workflow's prefix (use rule * from dpsad as dpsad_*)
        params = settings_for_job(local, rule, {"run": "dpgan_local"}).result_view()
        settings = stage_settings(fake_job(local, rule, {"run": "dpgan_local"}, params, [str(data)]))
        assert isinstance(settings, DpganSettings) and settings.checkpoint_every == 9 and "checkpoint_every" not in params
        assert settings.inputs_sha256 == inputs_sha256([str(data)]) and settings.result_view() == params
    teacher = stage_settings(fake_job(local, "train_teacher", {"teacher": "public"},
                                      teacher_settings(local, "public").result_view(), [str(data)]))
    assert isinstance(teacher, TeacherSettings) and teacher.checkpoint_every == local["teachers"]["public"]["checkpoint_every"]


def test_a_script_whose_params_disagree_with_the_configuration_stops(config):
    name = next(run["name"] for run in config["runs"] if run["method"] == "dpsad")
    params = settings_for_job(config, "distill_student", {"run": name}).result_view()
    with pytest.raises(DpsadError, match=r"distill_student: the settings in its params differ from those the configuration gives"):
        stage_settings(fake_job(config, "distill_student", {"run": name}, dict(params, lr=params["lr"] * 2), []))
