"""Load and validate the workflow configuration.

Validation uses the JSON schema in ``workflow/schemas/config.schema.yaml``
(strict: unknown keys are errors), fills its defaults, then checks the
relations a schema cannot express (runs naming configured teachers, per-run
overrides, ...).  Errors are one line: the key path, the bad value and what
was expected.
"""

from __future__ import annotations

import copy
import math
import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

from ..errors import DpsadError
from .stages import (
    TEACHER_METHODS,
    deep_merge,
    normalise_labels,
    pe_dpdm_share,
    pe_simulates,
    run_labels,
    run_section,
    simulator_cases,
    sweep_runs,
    teacher_labels,
    trains_dpdm,
)


# The public sources Sim-PE (pe.simulator) can render: dpsad.data.font_glyphs's renderers
FONT_SOURCES = ("font_digits", "font_letters")
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


def load_schema(path: str | Path | None = None) -> dict:
    path = Path(path) if path else SCHEMA_PATH
    if not path.is_file():
        raise DpsadError(f"the configuration schema {path} is missing, expected dpsad run from its checkout "
                         "(pip install -e ., which keeps workflow/ beside src/)")
    stat = path.stat()
    # a copy of the file's one parse in this process (a library user or a test validating many configs parsed it
    # each time: 20 ms of a validation's 55); edited, the file is parsed again
    return copy.deepcopy(_parsed_schema(path, stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=4)
def _parsed_schema(path: Path, mtime_ns: int, size: int) -> dict:
    # libyaml's parser where PyYAML has it: the schema is read at every Snakemake start (0.1 s in Python)
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _extend_with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "$ref" in subschema and "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
                elif "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def _path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def _message(error: jsonschema.ValidationError, where: str) -> str:
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return f"{where}: unknown key {', '.join(map(repr, extra))} at {_path(error)}{hint}"
    if error.validator == "enum":
        return f"{where}: {_path(error)} = {error.instance!r}, expected one of {error.validator_value}"
    if error.validator == "required":
        return f"{where}: {error.message} at {_path(error)}"
    if error.validator in ("oneOf", "anyOf") and error.schema.get("description"):
        return f"{where}: {_path(error)} = {error.instance!r}, expected {error.schema['description']}"
    return f"{where}: {_path(error)} = {error.instance!r}: {error.message}"


SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce_scalar_strings(instance, errors) -> bool:
    """Turn strings such as '5', '1e-5' or 'true' into numbers or booleans where the schema expects them.

    Snakemake's ``--config key={nested: 5}`` hands nested values over as strings.
    Returns True when something was changed.
    """
    changed = False
    # the alternatives of a oneOf/anyOf (e.g. distributed.processes: an integer or "auto") count too
    errors = [e for error in errors for e in [error, *(error.context or [])]]
    for error in errors:
        if error.validator != "type" or not isinstance(error.instance, str) or not error.absolute_path:
            continue
        try:
            value = yaml.safe_load(error.instance)
        except yaml.YAMLError:
            continue
        if isinstance(value, str) and SCIENTIFIC.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        if "integer" in expected and isinstance(value, float) and value.is_integer():
            value = int(value)  # '1.6e4' for a count
        kinds = {"integer": int, "number": (int, float), "boolean": bool, "null": type(None)}
        if any(k in kinds and isinstance(value, kinds[k]) and not (k != "boolean" and isinstance(value, bool)) for k in expected):
            parent = instance
            path = list(error.absolute_path)
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            changed = True
    return changed


def _resolved(subschema: dict, root: dict) -> dict:
    """``subschema`` with its local ``$ref`` (``#/$defs/...``) followed."""
    while isinstance(subschema, dict) and str(subschema.get("$ref", "")).startswith("#/"):
        target = root
        for part in subschema["$ref"][2:].split("/"):
            target = target[part]
        subschema = target
    return subschema if isinstance(subschema, dict) else {}


def _counts_only(subschema: dict, root: dict) -> bool:
    """Whether the schema takes integers and no other number (its alternatives included; an enum of integers)."""
    choices = subschema.get("enum")
    if choices and all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        return True
    kinds = [_resolved(s, root).get("type") for s in [subschema, *subschema.get("oneOf", []), *subschema.get("anyOf", [])]]
    kinds = {k for kind in kinds for k in (kind if isinstance(kind, list) else [kind]) if k}
    return "integer" in kinds and "number" not in kinds


def integers_as_int(instance, subschema: dict, root: dict):
    """Every integral float where the schema takes integers only, an int, in place: YAML reads 16.0 and 1.6e+4 as
    floats, and Snakemake compares params as text, so a count written so would look like a change and rerun the
    stage (a DP one reading the private records again).  Numbers that may be fractional keep their form."""
    subschema = _resolved(subschema, root)
    if isinstance(instance, dict):
        extra = subschema.get("additionalProperties")
        for key, value in instance.items():
            item_schema = _resolved(subschema.get("properties", {}).get(key, extra if isinstance(extra, dict) else {}), root)
            if isinstance(value, float) and value.is_integer() and _counts_only(item_schema, root):
                instance[key] = int(value)
            else:
                integers_as_int(value, item_schema, root)
    elif isinstance(instance, list) and isinstance(subschema.get("items"), dict):
        item_schema = _resolved(subschema["items"], root)
        for index, value in enumerate(instance):
            if isinstance(value, float) and value.is_integer() and _counts_only(item_schema, root):
                instance[index] = int(value)
            else:
                integers_as_int(value, item_schema, root)
    return instance


def validate_against(instance: dict, schema: dict, where: str = "config") -> dict:
    """Validate ``instance`` in place (defaults filled, counts as ints); raise DpsadError on the first error."""
    validator = _DefaultFillingValidator(schema)
    for _ in range(50):
        errors = sorted(validator.iter_errors(instance), key=lambda e: (len(list(e.absolute_path)), str(e.absolute_path)))
        if not errors or not _coerce_scalar_strings(instance, errors):
            break
    if errors:
        raise DpsadError(_message(errors[0], where))
    return integers_as_int(instance, schema, schema)


def validate_config(config: dict, schema_path: str | Path | None = None) -> dict:
    """Validate a workflow config in place and return it.  See the module docstring."""
    schema = load_schema(schema_path)
    # The top-level ``model`` is every teacher's (and DPDM's) default architecture; their own keys win.
    if isinstance(config.get("teachers"), dict) and isinstance(config.get("model", {}), dict):
        for name, teacher in config["teachers"].items():
            if isinstance(teacher, dict):
                config["teachers"][name] = {**teacher, "model": deep_merge(config.get("model", {}), teacher.get("model", {}))}
        dpdm = config.get("dpdm", {})
        if isinstance(dpdm, dict):
            # DPDM shares the teacher's keys, but a batch and steps left out are dp_sizing's, not a teacher's defaults.
            config["dpdm"] = {"batch_size": None, "steps": None, **dpdm,
                              "model": deep_merge(config.get("model", {}), dpdm.get("model", {}))}
    validate_against(config, schema)  # numbers given as text (--config) are numbers from here on
    check_finite_numbers(config)
    check_seeds(config)
    config["labels"] = normalise_labels(config["labels"])
    for teacher in config["teachers"].values():
        teacher["labels"] = normalise_labels(teacher["labels"])
    for run in list(config["runs"]) + list(config["audit"]["extra_runs"]):
        run["labels"] = normalise_labels(run["labels"])
    if config["dpdm"].get("labels") is not None:
        raise DpsadError(f"config: dpdm.labels = {config['dpdm']['labels']!r}, expected the label source in each "
                         "dpdm run's labels key")
    check_no_dpdm_population(config["dpdm"], "config: dpdm")
    curator_dir = config.get("curator_dir")
    if curator_dir and not Path(str(curator_dir)).expanduser().is_absolute():
        raise DpsadError(f"config: curator_dir = '{curator_dir}', expected an absolute path (or ~/...): a relative "
                         "folder gives each workspace a curator's record of its own")
    check_datasets(config)
    check_central(config)
    check_teachers(config)
    feature_teacher = config["kmeans"]["teacher"]
    if feature_teacher is not None:
        known = config["teachers"].get(feature_teacher)
        if known is None or known["split"] != "public" or known["privacy"] != "none" or teacher_labels(config, feature_teacher) == "kmeans":
            raise DpsadError(f"config: kmeans.teacher = '{feature_teacher}', expected a teacher trained on the public split "
                             "without DP and without k-means labels")
    elif config["kmeans"]["features"] == "teacher":
        raise DpsadError("config: kmeans.features = 'teacher' but kmeans.teacher is not set, expected a public teacher's name")
    if config["sweep"]["teacher"] not in config["teachers"]:
        raise DpsadError(f"config: sweep.teacher = '{config['sweep']['teacher']}', expected one of {', '.join(config['teachers'])}")
    check_runs(config, schema)
    for name, teacher in config["teachers"].items():
        if teacher["split"] == "population":
            check_population(config, name, teacher["population"])
    check_labels_exist(config)
    sort_in_place(config)
    return config


def check_datasets(config: dict) -> None:
    """Each listed dataset is configured, with the files, sizes and public data its source needs."""
    for name in config["datasets"]:
        if name not in config["data"]:
            raise DpsadError(f"config: datasets lists '{name}', expected a matching entry under data: ({', '.join(config['data'])})")
    for name, section in config["data"].items():
        if section["source"] == "celeba" and section.get("image_size") not in (32, 64):
            raise DpsadError(f"config: data.{name}.image_size = {section.get('image_size')!r}, expected 32 or 64 for celeba")
        if section["source"] in ("npz", "hdf5") and not section.get("path"):
            raise DpsadError(f"config: data.{name}.path is missing, expected the {section['source']} file's path")
        check_release(name, section)
        if section.get("class_names") and section.get("num_classes") and len(section["class_names"]) != section["num_classes"]:
            raise DpsadError(f"config: data.{name}: num_classes {section['num_classes']} but {len(section['class_names'])} "
                             "class_names, expected one of the two, or both agreeing")
        public_split_users = [t for t, teacher in config["teachers"].items() if teacher["split"] == "public"]
        if section.get("public") is None and section["public_fraction"] == 0 and public_split_users:
            raise DpsadError(f"config: data.{name}.public_fraction = 0 and no data.{name}.public source, but teachers "
                             f"{public_split_users} train on the public split, expected a public_fraction above 0 or a public source")
        if section["source"] in ("mnist", "fashion_mnist", "celeba", "imagefolder") and not section.get("root"):
            raise DpsadError(f"config: data.{name}.root is missing, expected the folder holding the {section['source']} files")


def check_teachers(config: dict) -> None:
    """Each teacher's warm start, size, privacy and trained part agree."""
    for name, teacher in config["teachers"].items():
        check_init(config, teacher["init"], f"config: teachers.{name}.init", name)
        for key in ("batch_size", "steps"):
            if teacher[key] is None:
                raise DpsadError(f"config: teachers.{name}.{key} = null, expected a positive integer (dp_sizing "
                                 "sizes DP-SAD students, DPDM and dp-GAN, not teachers)")
        if teacher["privacy"] == "dp":
            if teacher["split"] != "private":
                raise DpsadError(f"config: teachers.{name}.privacy = 'dp' with split = '{teacher['split']}', expected split: private")
            if not teacher.get("target_epsilon"):
                raise DpsadError(f"config: teachers.{name}.target_epsilon is missing, expected a number for privacy: dp")
        population = teacher.get("population")
        if (teacher["split"] == "population") != (population is not None):
            raise DpsadError(f"config: teachers.{name}: split '{teacher['split']}' with population {population!r}, "
                             "expected split: population with population: <a PE run>, or neither")
        if teacher.get("trainable", "all") in ("lora", "auto") and teacher["init"] == "scratch":
            raise DpsadError(f"config: teachers.{name}.trainable = {teacher['trainable']!r} with init: scratch, expected "
                             "init: <a public teacher> (adapters on random weights would train nothing useful)")


def check_simulator_run(config: dict, run: dict, where: str) -> None:
    """A Sim-PE run (``pe.simulator``) renders each class of each dataset with the dataset's public font source."""
    if pe_dpdm_share(config, run) is not None:
        raise DpsadError(f"{where}: pe.simulator: true with pe.dpdm_share set, expected one of the two (PE evolves "
                         "either the font renderer or a DPDM training)")
    if run_labels(config, run) is not True:
        raise DpsadError(f"{where}: pe.simulator: true with labels {run_labels(config, run)!r}, expected labels: true "
                         "(the renderer draws each class's character)")
    for name in config["datasets"]:
        source = (config["data"][name].get("public") or {}).get("source")
        if source not in FONT_SOURCES:
            raise DpsadError(f"{where}: pe.simulator: true but data.{name}.public.source = {source!r}, expected one "
                             f"of {', '.join(FONT_SOURCES)} (the renderer PE evolves)")
        if simulator_cases(config, run) == "both" and source != "font_letters":
            raise DpsadError(f"{where}: pe.simulator_cases: both but data.{name}.public.source = {source!r}, expected "
                             "font_letters (only letters have two cases)")


RUN_SET_KEYS = ("split", "privacy", "target_epsilon", "delta")  # what run_section sets in DPDM's section


def _take_back(override: dict, validated: dict) -> None:
    """The run's own override keys, in place, as validation left them in the merged section (numbers given as text
    are numbers, counts ints): the settings and the params are built from the overrides, so '1e-3' (text in YAML
    1.1) reached the job as text and, beside a run written 0.001, looked like a change that reruns the stage."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(validated.get(key), dict):
            _take_back(value, validated[key])
        elif key in validated:
            override[key] = copy.deepcopy(validated[key])


def check_runs(config: dict, schema: dict) -> None:
    """Each run (audit-only and sweep runs too): a unique name, a teacher it may use, a budget where it spends one,
    and its sections with the run's overrides (:func:`dpsad.config.stages.run_section`) valid against the schema."""
    section_schema = lambda name: schema["$defs"][name] | {"$defs": schema["$defs"]}  # noqa: E731
    seen = set()
    extra = config["audit"]["extra_runs"]
    sweep = {run["name"] for run in sweep_runs(config)}
    for run in config["runs"]:
        if run["name"] in sweep:
            raise DpsadError(f"config: run name '{run['name']}' is also a sweep run's name, expected another name")
    # the sweep's runs too: a setting only they use (dpdm.init where no run trains DPDM, a sweep.teacher on a PE
    # run's population) would otherwise fail in their jobs, after other trainings had spent their time
    listed, extra_end = list(config["runs"]) + list(extra), len(config["runs"]) + len(extra)
    for index, run in enumerate(listed + sweep_runs(config)):
        where = (f"config: runs[{index}] ({run['name']})" if index < len(config["runs"])
                 else f"config: audit.extra_runs[{index - len(config['runs'])}] ({run['name']})" if index < extra_end
                 else f"config: sweep (run {run['name']}, teacher '{run['teacher']}')")

        def validated(name: str, section: str) -> dict:
            merged = validate_against(run_section(config, run, name), section_schema(section), f"{where}.{name}")
            if isinstance(run.get(name), dict):  # not the keys run_section sets (DPDM's split and target)
                _take_back(run[name], {k: v for k, v in merged.items() if k not in RUN_SET_KEYS})
            return merged

        if run["name"] in seen:
            raise DpsadError(f"{where}: duplicate run name '{run['name']}', expected unique names")
        seen.add(run["name"])
        if run["teacher"] not in config["teachers"]:
            raise DpsadError(f"{where}: teacher = '{run['teacher']}', expected one of {', '.join(config['teachers'])}")
        if run["method"] in TEACHER_METHODS and run["labels"] is not None and not trains_dpdm(config, run):
            own = teacher_labels(config, run["teacher"])
            if run["labels"] != own:
                raise DpsadError(f"{where}: labels = {run['labels']!r} but teacher '{run['teacher']}' is conditioned on "
                                 f"labels {own!r}, expected a teacher with labels: {run['labels']!r} (or no labels key)")
        if run["method"] == "nonprivate" and config["teachers"][run["teacher"]]["split"] != "private":
            # its card says "trained on the private records without noise"; the row is the table's ceiling
            raise DpsadError(f"{where}: method nonprivate samples teacher '{run['teacher']}' trained on split "
                             f"'{config['teachers'][run['teacher']]['split']}', expected a teacher with split: private")
        if run["method"] == "public":
            teacher = config["teachers"][run["teacher"]]
            if teacher["split"] != "public" or teacher["privacy"] != "none":
                raise DpsadError(f"{where}: method public samples teacher '{run['teacher']}' trained on split "
                                 f"'{teacher['split']}', expected a teacher with split: public (it reads no private record)")
            if run.get("target_epsilon") is not None:
                raise DpsadError(f"{where}: target_epsilon = {run['target_epsilon']} for method public, expected none "
                                 "(the public row spends no privacy budget)")
        if run["method"] in ("dpsad", "dpdm", "dpgan", "pe") and run.get("target_epsilon") is None:
            raise DpsadError(f"{where}: target_epsilon is missing, expected a number for method {run['method']}")
        if run["method"] == "pe":
            validated("pe", "pe")
            if config["teachers"][run["teacher"]]["split"] == "population":  # a chain of populations, or a cycle
                raise DpsadError(f"{where}: method pe with teacher '{run['teacher']}' on a PE run's population, expected "
                                 "a teacher on public data or a DP teacher, or no teacher key with pe.dpdm_share or "
                                 "pe.simulator (or evolve that PE run further instead)")
            if pe_simulates(config, run):
                check_simulator_run(config, run, where)
        if run["method"] == "dpgan":
            validated("dpgan", "dpgan")
        if trains_dpdm(config, run):
            dpdm = validated("dpdm", "teacher")
            check_no_dpdm_population(dpdm, f"{where}.dpdm")
            check_init(config, dpdm["init"], f"{where}.dpdm.init")
            if run["method"] == "pe" and run["teacher"] not in ("public", dpdm["init"]):  # 'public': the default
                raise DpsadError(f"{where}: teacher = '{run['teacher']}' with pe.dpdm_share set, expected no teacher key "
                                 f"(PE evolves the run's own DPDM training, warm-started from dpdm.init = "
                                 f"'{dpdm['init']}'): a teacher here would not be used")
            if dpdm.get("trainable", "all") in ("lora", "auto") and dpdm["init"] == "scratch":
                raise DpsadError(f"{where}.dpdm: trainable = {dpdm['trainable']!r} with init: scratch, expected init: <a "
                                 "public teacher> (adapters on random weights would train nothing useful)")
        student = validated("student", "student")
        if run["method"] == "dpsad" and student["trainable"] in ("lora", "auto") and not student["init_from_teacher"]:
            raise DpsadError(f"{where}.student: trainable = {student['trainable']!r} with init_from_teacher: false, "
                             "expected init_from_teacher: true (adapters on random weights would train nothing useful)")
        if run["method"] == "dpsad" and student["mode"] == "paper" and not student["allow_unsound"]:
            raise DpsadError(f"{where}: student.mode = 'paper' is the paper's printed mechanism, which is not DP; "
                             "expected mode: sound, or allow_unsound: true to run it for reproduction only")
        validated("sample", "sample")


def _walk(value, where: str = ""):
    """Yield (dotted path, value) for every leaf of a nested config."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for number, item in enumerate(value):
            yield from _walk(item, f"{where}[{number}]")
    else:
        yield where, value


def check_finite_numbers(config: dict) -> None:
    """Refuse ``.nan``, ``.inf`` and ``-.inf`` anywhere: YAML allows them wherever a number is, and each would
    train, calibrate or sample on a number that means nothing (an infinite epsilon, an all-black sample)."""
    for where, value in _walk(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise DpsadError(f"config: {where} = {value}, expected a finite number")


SEED_RANGE = (0, 2**63 - 1)  # what every generator here (torch, numpy) accepts


def check_seeds(config: dict) -> None:
    """Seeds are integers in [0, 2**63 - 1]; torch refuses negative ones half-way through a stage."""
    for where, value in _walk(config):
        key = where.rsplit(".", 1)[-1]
        if key.endswith("seed") and isinstance(value, int) and not isinstance(value, bool):
            if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
                raise DpsadError(f"config: {where} = {value}, expected an integer seed from 0 to 2**63 - 1")


def sort_in_place(value) -> None:
    """Sort the keys of every dict in ``value`` in place, recursively (lists keep their order).

    Snakemake compares a job's params with the last run's by their text, so the order of keys counts: a
    default written out explicitly (merged in at another place) must not rerun a stage, nor a DP stage
    spend its budget again.  Sorting the whole configuration once makes every params dict order-free."""
    if isinstance(value, dict):
        items = sorted(value.items())
        value.clear()
        value.update(items)
        for item in value.values():
            sort_in_place(item)
    elif isinstance(value, list):
        for item in value:
            sort_in_place(item)


def source_has_labels(section: dict) -> bool | None:
    """Whether a dataset's source holds labels: False for ``unlabelled: true`` or an npz/hdf5 file with
    ``images`` but no ``labels``, True for the other sources, None when the file cannot be read yet or has
    no ``images`` (prepare_data then says what is wrong with it, in one line)."""
    if section.get("unlabelled"):
        return False
    path = section.get("path")
    try:
        if section["source"] == "npz":
            import numpy as np

            archive = np.load(path, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                return None
            with archive:
                return "labels" in archive.files if "images" in archive.files else None
        if section["source"] == "hdf5":
            import h5py

            with h5py.File(path, "r") as handle:
                return "labels" in handle if "images" in handle else None
    except Exception:  # noqa: BLE001 - unreadable for any reason: prepare_data reads it and says why
        return None
    return True


def check_labels_exist(config: dict) -> None:
    """``labels: true`` (a teacher's or a run's) on a dataset without labels fails when the config is read."""
    users = [f"teacher '{name}'" for name in config["teachers"] if teacher_labels(config, name) is True]
    users += [f"run '{run['name']}'" for run in config["runs"] if run_labels(config, run) is True]
    if not users:
        return
    for name in config["datasets"]:
        if source_has_labels(config["data"][name]) is False:
            raise DpsadError(f"config: data.{name}: labels: true but the dataset has no labels, expected labels: kmeans "
                             f"or none for unlabelled data (set for {', '.join(users[:3])}{', ...' if len(users) > 3 else ''})")


def check_init(config: dict, init: str, where: str, own_name: str | None = None) -> None:
    """``init`` is scratch or a teacher that trains without noise on public data only: the public split, or the
    central images of the DP warm-up (a DP release whose ledger every descendant composes), from scratch itself.
    """
    if init == "scratch":
        return
    teacher = config["teachers"].get(init)
    if teacher is None or init == own_name:
        raise DpsadError(f"{where} = '{init}', expected scratch or the name of another teacher ({', '.join(config['teachers'])})")
    if teacher["split"] not in ("public", "central") or teacher["privacy"] != "none" or teacher["init"] != "scratch":
        raise DpsadError(f"{where} = '{init}': that teacher trains on split '{teacher['split']}' with privacy "
                         f"'{teacher['privacy']}' and init '{teacher['init']}', expected split: public or central, "
                         "privacy: none, init: scratch")


def check_no_dpdm_population(dpdm: dict, where: str) -> None:
    """DPDM shares the teachers' keys but always trains on the private split: a ``population`` there would be
    read by nothing (failure prevented: a user who meant DPDM on PE's population gets DPDM on the private split)."""
    if dpdm.get("population") is not None:
        raise DpsadError(f"{where}.population = {dpdm['population']!r}, expected none: DPDM trains on the private "
                         "split (a teacher on a PE run's population is teachers.<name>.split: population)")


def check_population(config: dict, name: str, population: str) -> None:
    """A teacher on a PE run's population: that run exists and is PE on the teacher's labels (true or none: the
    population's labels are the run's), and each DP-SAD run distilling it has a larger target than the votes'.  No
    PE run evolves such a teacher (:func:`check_runs`): no cycle."""
    where = f"config: teachers.{name}.population = '{population}'"
    runs = {run["name"]: run for run in config["runs"]}
    pe_runs = [run_name for run_name, run in runs.items() if run["method"] == "pe"]
    if population not in runs or runs[population]["method"] != "pe":
        raise DpsadError(f"{where}, expected a run of method pe ({', '.join(pe_runs) or 'none configured'})")
    run = runs[population]
    labels = teacher_labels(config, name)
    if labels == "kmeans" or labels != run_labels(config, run):
        raise DpsadError(f"{where}: the teacher is on labels {labels!r} and the run on {run_labels(config, run)!r}, "
                         "expected the same, true or none (the population is labelled by the run)")
    for user in list(config["runs"]) + sweep_runs(config):  # else it fails at planning, after the votes and teacher
        if user["teacher"] == name and user["method"] == "dpsad" and user["target_epsilon"] <= run["target_epsilon"]:
            raise DpsadError(f"config: run '{user['name']}': target_epsilon = {user['target_epsilon']} distilling teacher "
                             f"'{name}' on PE run '{population}' at {run['target_epsilon']}, expected more (the run's "
                             "target includes the votes)")


def check_central(config: dict) -> None:
    """Teachers on the central images need each dataset's budget delta, which the warm-up is calibrated at."""
    users = [name for name, teacher in config["teachers"].items() if teacher["split"] == "central"]
    if not users:
        return
    for user in users:
        if teacher_labels(config, user) == "kmeans":
            raise DpsadError(f"config: teachers.{user}.labels = kmeans with split: central, expected true or none "
                             "(the central images are grouped by the dataset's own labels)")
    for name in config["datasets"]:
        budget = config["data"][name].get("privacy_budget") or {}
        if budget.get("delta") is None:
            raise DpsadError(f"config: data.{name}.privacy_budget is missing, expected one with a delta: teachers "
                             f"{users} train on the central images, calibrated at that delta")


def check_release(name: str, section: dict) -> None:
    """A budget caps ``data.<name>.release`` (its names are checked when a release is built: a config that
    replaces ``runs`` still loads)."""
    if section["release"] and section["privacy_budget"] is None:
        raise DpsadError(f"config: data.{name}.release lists runs but data.{name}.privacy_budget is not set, "
                         "expected {epsilon, delta}: the budget that every release of this dataset together must fit")
    declared = section.get("earlier_use") or {}
    for key in ("epsilon", "delta"):  # the schema's minimum lets NaN through, and a NaN cost would pass every budget
        if declared.get(key) is not None and not math.isfinite(float(declared[key])):
            raise DpsadError(f"config: data.{name}.earlier_use.{key} = {declared[key]}, expected a finite number "
                             "(or null where the cost is not known)")
    if declared.get("epsilon") is not None and declared.get("delta") is None:
        # an unknown delta counted as 0 would understate the earlier use: pure epsilon-DP says delta: 0 itself
        raise DpsadError(f"config: data.{name}.earlier_use gives epsilon {declared['epsilon']:g} but no delta, expected "
                         "its delta too (0 for pure epsilon-DP)")


def load_config_file(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML config, apply ``overrides`` (merged), validate and return it."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    if overrides:
        config = deep_merge(config, overrides)
    return validate_config(config)
