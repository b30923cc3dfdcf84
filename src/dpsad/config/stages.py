"""What each stage is given: a run's method settings (with its target and the dp_sizing rule), labels,
sampling settings, the runs by name, and the merge every configuration layer goes through."""

from __future__ import annotations

import copy
from typing import Any

from ..errors import DpsadError
from .settings import (DpdmSettings, DpganSettings, MethodSettings, PeSettings, StudentSettings, TeacherSettings,
                       sorted_keys)


# Which compute and minimum number of steps each method's training uses (keys of the dp_sizing section).
METHOD_KEYS = {
    "student": ("example_gradients", "min_steps"),
    "dpdm": ("example_gradients", "min_steps"),
    "dpgan": ("critic_example_gradients", "critic_min_steps"),
}


def deep_merge(base: dict, override: dict) -> dict:
    """Return a copy of ``base`` with ``override`` merged in (nested dicts merged, the rest replaced)."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


TEACHER_METHODS = ("dpsad", "nonprivate", "public", "pe")  # methods whose generator is, or is distilled from, a teacher


def normalise_labels(value):
    """The label switch with the string 'true' (command-line --config) read as True."""
    return True if value == "true" else value


def teacher_labels(config: dict, name: str):
    """A teacher's label source: its own ``labels`` key, else the top-level ``labels``."""
    own = config["teachers"][name].get("labels")
    return normalise_labels(config["labels"] if own is None else own)


def run_labels(config: dict, run: dict):
    """A run's label source: its own ``labels`` key, else its teacher's (dpsad, nonprivate, public, pe), or the
    warm start's of a DPDM training (dpdm, pe with ``dpdm_share``), else the top-level ``labels``."""
    if run.get("labels") is not None:
        return normalise_labels(run["labels"])
    if trains_dpdm(config, run):
        init = dpdm_settings(config, run).init
        return teacher_labels(config, init) if init != "scratch" and init in config["teachers"] else normalise_labels(
            config["labels"])
    if run["method"] in TEACHER_METHODS:
        return teacher_labels(config, run["teacher"])
    return normalise_labels(config["labels"])


def audit_run_names(config: dict) -> list[str]:
    """The names in ``audit.runs``; an unknown one is an error, raised only when the audit target is built
    (configs that replace ``runs`` keep working for every other target)."""
    known = {run["name"] for run in list(config["runs"]) + list(config["audit"]["extra_runs"])}
    for name in config["audit"]["runs"]:
        if name not in known:
            raise DpsadError(f"config: audit.runs lists '{name}', expected a name from runs or audit.extra_runs ({', '.join(sorted(known))})")
    return list(config["audit"]["runs"])


def sweep_runs(config: dict) -> list[dict[str, Any]]:
    """The runs of the ``sweep`` target: every method of ``sweep.methods`` at every ``sweep.epsilons``."""
    sweep = config["sweep"]
    return [{"name": f"sweep_{method}_eps{epsilon:g}", "method": method, "teacher": sweep["teacher"], "labels": None,
             "target_epsilon": float(epsilon), "delta": sweep["delta"], "student": {}, "dpdm": {}, "dpgan": {},
             "sample": {}} for method in sweep["methods"] for epsilon in sweep["epsilons"]]


def sweep_points_among_runs(config: dict) -> list[dict[str, Any]]:
    """The runs of ``runs`` that are points of the sweep as they stand: a sweep method with the sweep's teacher
    (DP-SAD), the sweep's delta, the dataset's labels and no per-run overrides, i.e. the run the sweep would
    train at that epsilon.  The sweep plots them instead of training them twice."""
    sweep = config["sweep"]
    return [run for run in config["runs"]
            if run["method"] in sweep["methods"] and run.get("target_epsilon") is not None
            and float(run["delta"]) == float(sweep["delta"]) and run.get("labels") is None
            and (run["method"] != "dpsad" or run.get("teacher", "public") == sweep["teacher"])
            and not any(run.get(key) for key in ("student", "dpdm", "dpgan", "sample"))]


def run_by_name(config: dict, name: str) -> dict[str, Any]:
    """A run of ``runs`` or of the sweep target."""
    for run in list(config["runs"]) + sweep_runs(config):
        if run["name"] == name:
            return run
    raise DpsadError(f"run '{name}' is not configured, expected one of {', '.join(r['name'] for r in config['runs'])}")


def audit_run_by_name(config: dict, name: str) -> dict[str, Any]:
    """A run to audit: one of ``runs`` or of ``audit.extra_runs`` (trained only for the audit)."""
    extra = config.get("audit", {}).get("extra_runs", [])
    for run in list(config["runs"]) + list(extra):
        if run["name"] == name:
            return run
    names = [r["name"] for r in list(config["runs"]) + list(extra)]
    raise DpsadError(f"audit run '{name}' is not configured, expected one of {', '.join(names)}")


def method_settings(config: dict, run: dict) -> MethodSettings:
    """The training settings of a run's method: student (dpsad and the teacher-only methods), dpdm, dpgan or pe."""
    return {"dpdm": dpdm_settings, "dpgan": dpgan_settings, "pe": pe_settings}.get(run["method"], student_settings)(
        config, run)


def sizing_section(config: dict, method: str) -> dict:
    """The ``dp_sizing`` keys a method's training reads (its compute and fewest steps, and the shared ones)."""
    shared = ("target_snr", "max_sample_rate", "min_batch_size")
    return {key: config["dp_sizing"][key] for key in METHOD_KEYS[method] + shared}


def dp_target(run: dict) -> dict:
    """The run's privacy target, as every DP method's settings carry it (the DP plan reads it there)."""
    return {"target_epsilon": run.get("target_epsilon"), "delta": run.get("delta")}


def teacher_settings(config: dict, name: str) -> TeacherSettings:
    """The settings of ``teachers.<name>``."""
    settings = TeacherSettings.from_section(config["teachers"][name], f"config: teachers.{name}")
    return settings if settings.privacy == "dp" else without_subspace(settings, f"teachers.{name}")


def without_subspace(settings, section: str):
    """``settings``, unless its ``dp.subspace`` is set: the projection is built for DPDM, DP teachers and the DP-SAD
    student (with its discriminator) only."""
    if settings.dp.subspace:
        raise DpsadError(f"config: {section}.dp.subspace: true, expected it left out (the public subspace is built "
                         "for DPDM, DP teachers and the DP-SAD student only)")
    return settings


def pe_simulates(config: dict, run: dict) -> bool:
    """Whether a PE run evolves its dataset's public font renderer (``pe.simulator``, Sim-PE)."""
    return run.get("method") == "pe" and bool(deep_merge(config["pe"], run.get("pe", {})).get("simulator"))


def simulator_cases(config: dict, run: dict) -> str:
    """Which cases a Sim-PE run's renderer draws each letter in (``pe.simulator_cases``): ``public`` or ``both``."""
    return deep_merge(config["pe"], run.get("pe", {})).get("simulator_cases") or "public"


def pe_dpdm_share(config: dict, run: dict) -> float | None:
    """The share of a PE run's target its DPDM generator spends (``pe.dpdm_share``), else None (PE evolves the
    run's teacher, and no other method trains a DPDM generator)."""
    return deep_merge(config["pe"], run.get("pe", {})).get("dpdm_share") if run.get("method") == "pe" else None


def trains_dpdm(config: dict, run: dict) -> bool:
    """Whether the run trains a DPDM model: a DPDM run, or a PE run evolving one."""
    return run["method"] == "dpdm" or pe_dpdm_share(config, run) is not None


def run_section(config: dict, run: dict, name: str) -> dict:
    """The global section ``name`` with the run's overrides merged in (DPDM's on the private split by DP-SGD to the
    run's target, or to its share of a PE run's target): the one place a run's overrides are merged, which
    validation checks and the settings are built from."""
    merged = deep_merge(config[name], run.get(name, {}))
    if name == "dpdm":
        merged.update(split="private", privacy="dp", **dp_target(run))
        if (share := pe_dpdm_share(config, run)) is not None and run.get("target_epsilon") is not None:
            merged["target_epsilon"] = share * run["target_epsilon"]
    return merged


def student_settings(config: dict, run: dict) -> StudentSettings:
    """The global ``student`` section with the run's overrides merged in, its target and the dp_sizing rule."""
    settings = StudentSettings.from_section({**run_section(config, run, "student"), **dp_target(run),
                                             "dp_sizing": sizing_section(config, "student")}, "config: student")
    if settings.dp.subspace and settings.mode != "sound":
        raise DpsadError(f"config: student.dp.subspace: true with mode '{settings.mode}', expected mode 'sound' (the "
                         "paper's update has no noisy sum of per-example gradients to project)")
    return settings


def sample_settings(config: dict, run: dict) -> dict:
    """The global ``sample`` section with the run's overrides merged in (keys sorted: it is a rule's params)."""
    return sorted_keys(run_section(config, run, "sample"))


def dpdm_settings(config: dict, run: dict) -> DpdmSettings:
    """The ``dpdm`` section with the run's overrides, trained on the private split by DP-SGD to the run's target."""
    return DpdmSettings.from_section({**run_section(config, run, "dpdm"), "dp_sizing": sizing_section(config, "dpdm")},
                                     "config: dpdm")


def dpgan_settings(config: dict, run: dict) -> DpganSettings:
    """The ``dpgan`` section with the run's overrides, its target and the dp_sizing rule its critic reads."""
    return without_subspace(DpganSettings.from_section(
        {**run_section(config, run, "dpgan"), **dp_target(run),
         "dp_sizing": sizing_section(config, "dpgan")}, "config: dpgan"), "dpgan")


def pe_settings(config: dict, run: dict) -> PeSettings:
    """The ``pe`` section with the run's overrides and its target (Private Evolution plans its own sizes)."""
    return PeSettings.from_section({**run_section(config, run, "pe"), **dp_target(run)}, "config: pe")


def settings_for_job(config: dict, rule: str, wildcards) -> MethodSettings:
    """The settings of a training job, by its rule's name (with or without a module prefix, ``use rule * from
    dpsad as dpsad_*``) and wildcards: the one builder both the rule's params and its script use."""
    if rule.endswith("train_teacher"):
        return teacher_settings(config, wildcards["teacher"])
    if rule.endswith("audit_run"):
        return method_settings(config, audit_run_by_name(config, wildcards["audited"]))
    if rule.endswith("train_dpdm"):  # a DPDM run's, or the DPDM generator of a PE run's (pe.dpdm_share)
        return dpdm_settings(config, run_by_name(config, wildcards["run"]))
    return method_settings(config, run_by_name(config, wildcards["run"]))


def released_runs(config: dict, dataset: str) -> list[str]:
    """The runs ``data.<dataset>.release`` lists, in order (the order in which the budget is filled)."""
    known = [run["name"] for run in config["runs"]]
    listed = list(config["data"][dataset]["release"])
    for run in listed:
        if run not in known:
            raise DpsadError(f"config: data.{dataset}.release lists '{run}', expected one of the runs ({', '.join(known)})")
    return listed


def accountant_of(config: dict, run: dict) -> str:
    """The accountant a run's privacy is composed with (its method's ``dp.accountant``)."""
    return method_settings(config, run).dp.accountant
