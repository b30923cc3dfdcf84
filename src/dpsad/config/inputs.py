"""What a job of each rule reads: the workflow's input functions, from the validated config and the job's wildcards.

Each function takes ``(config, wildcards)`` (``wildcards``: Snakemake's, or any object with the attributes
``dataset``, ``run``, ``teacher``, ``audited`` a rule has) and returns paths under ``results/`` or settings; the
Snakefile binds them to its config (``workflow/rules/common.smk``).  Pure: no file is read, nothing is written.

Provenance.  Every artifact a stage builds from carries a cumulative ledger beside it (X.pt or X.h5 ->
X.ledger.json): its own use of private records and those of everything it was built from.  A stage that writes a
ledger takes its inputs through :func:`with_upstream_ledgers`, so the ledgers it composes are derived from the very
input functions that build the DAG: a new input cannot be forgotten in a second list.
"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

from ..errors import DpsadError
from .reruns import data_settings
from .stages import (audit_run_by_name, audit_run_names, dpdm_settings, dpgan_settings, method_settings, pe_settings,
                     pe_simulates, run_by_name, run_labels, sample_settings, student_settings, sweep_points_among_runs, sweep_runs,
                     teacher_labels, teacher_settings, trains_dpdm)

PREPARED_DATA = "results/{dataset}/data.h5"  # the private records themselves: each reading stage accounts for them
RELEASE_CHECK = "results/{dataset}/release_check.json"  # the curator's check, written with BUDGET.json
GENERATOR_FILES = {"dpsad": "student", "dpdm": "dpdm", "dpgan": "dpgan", "pe": "pe"}
INCEPTION_KEYS = ("inception_weights", "inception_samples")  # evaluate keys read by the inception_figures stage only


def run(config: dict, wildcards) -> dict:
    return run_by_name(config, wildcards.run)


def dataset_settings(config: dict, wildcards) -> dict:
    """How the data is prepared: the dataset's section without what decides its release or where its files are."""
    return data_settings(config["data"][wildcards.dataset])


def result_view(settings_of, run_of=run):
    """An input function: the result fields of ``settings_of(config, <the job's run>)`` (a change reruns the stage
    and, for a DP stage, spends budget again; execution-only fields do not)."""
    return lambda config, wildcards: settings_of(config, run_of(config, wildcards)).result_view()


student = result_view(student_settings)
dpdm = result_view(dpdm_settings)
dpgan = result_view(dpgan_settings)
pe = result_view(pe_settings)


def sample(config: dict, wildcards) -> dict:
    return sample_settings(config, run(config, wildcards))


def teacher_file(dataset: str, name: str | None) -> list[str]:
    """The checkpoint of teacher ``name`` as a list of inputs (none without a name)."""
    return [f"results/{dataset}/teacher/{name}.pt"] if name else []


def run_teacher(config: dict, wildcards) -> str:
    return f"results/{wildcards.dataset}/teacher/{run(config, wildcards)['teacher']}.pt"


def pe_generator(config: dict, wildcards) -> str | list[str]:
    """The model a PE run evolves: its own DPDM training where ``pe.dpdm_share`` is set, else its teacher; nothing
    for Sim-PE (``pe.simulator``) voting in pixels (the renderer is the generator, and no model is read)."""
    the_run = run(config, wildcards)
    if trains_dpdm(config, the_run):
        return f"results/{wildcards.dataset}/{wildcards.run}/dpdm.pt"
    if pe_simulates(config, the_run) and pe_settings(config, the_run).embedding == "pixels":
        return []
    return run_teacher(config, wildcards)


def generator(config: dict, wildcards) -> str:
    """The checkpoint a run samples from: the student for DP-SAD, the teacher-style model otherwise."""
    name = GENERATOR_FILES.get(run(config, wildcards)["method"])
    return f"results/{wildcards.dataset}/{wildcards.run}/{name}.pt" if name else run_teacher(config, wildcards)


def feature_teacher(config: dict, wildcards) -> list[str]:
    """The public teacher whose encoder features k-means also clusters (kmeans.teacher), else nothing."""
    return teacher_file(wildcards.dataset, config["kmeans"]["teacher"])


def label_teacher(config: dict, wildcards) -> list[str]:
    """The teacher whose encoder features the labels are fitted on (kmeans.features: teacher), else nothing."""
    return feature_teacher(config, wildcards) if config["kmeans"]["features"] == "teacher" else []


def label_features(config: dict, wildcards) -> str | list[str]:
    """The MoCo features the labels are fitted on (kmeans.features: moco), else nothing: labels from a teacher's
    features or the pixels neither wait for MoCo nor carry its ledger (the cluster report still reads them)."""
    return f"results/{wildcards.dataset}/moco/features.h5" if config["kmeans"]["features"] == "moco" else []


def label_kmeans_settings(config: dict, wildcards) -> dict:
    """The k-means settings that shape the labels: kmeans.teacher only when the labels use its features (else it
    adds a row to the cluster report, and changing it must not rerun the labels and the DP stages after them)."""
    uses_teacher = config["kmeans"]["features"] == "teacher"
    return {k: v for k, v in config["kmeans"].items() if k != "teacher" or uses_teacher}


def labels(config: dict, wildcards):
    """The run's label source: true, kmeans or none."""
    return run_labels(config, run(config, wildcards))


def teacher_label_source(config: dict, wildcards):
    return teacher_labels(config, wildcards.teacher)


def pseudo_label_files(dataset: str, label_source) -> list[str]:
    """labels.h5 of the k-means stage for a kmeans label source, else nothing."""
    return [f"results/{dataset}/labels.h5"] if label_source == "kmeans" else []


def pseudo_labels(config: dict, wildcards) -> list[str]:
    return pseudo_label_files(wildcards.dataset, labels(config, wildcards))


def teacher_pseudo_labels(config: dict, wildcards) -> list[str]:
    return pseudo_label_files(wildcards.dataset, teacher_label_source(config, wildcards))


def dpdm_init_teacher(config: dict, run_section: dict) -> str | None:
    """The public teacher a DPDM training starts from (``dpdm.init``), or None."""
    init = dpdm_settings(config, run_section).init if trains_dpdm(config, run_section) else "scratch"
    return None if init == "scratch" else init


def dpdm_init(config: dict, wildcards) -> list[str]:
    return teacher_file(wildcards.dataset, dpdm_init_teacher(config, run(config, wildcards)))


def teacher_init(config: dict, wildcards) -> list[str]:
    """The public teacher a teacher starts from (``teachers.<name>.init``), else nothing."""
    init = config["teachers"][wildcards.teacher]["init"]
    return teacher_file(wildcards.dataset, None if init == "scratch" else init)


def teacher_central(config: dict, wildcards) -> list[str]:
    """The central images of the DP warm-up when the teacher trains on them (``split: central``), else nothing."""
    central = config["teachers"][wildcards.teacher]["split"] == "central"
    return [f"results/{wildcards.dataset}/central.h5"] if central else []


def teacher_population(config: dict, wildcards) -> list[str]:
    """The population of the PE run a teacher trains on (``split: population``; its ledger then comes upstream),
    else nothing."""
    teacher = config["teachers"][wildcards.teacher]
    population = teacher["split"] == "population"
    return [f"results/{wildcards.dataset}/{teacher['population']}/pe.pt"] if population else []


def ledger_of(path) -> str:
    """The cumulative ledger beside an artifact: results/.../X.pt (or .h5) -> results/.../X.ledger.json."""
    stem, dot, suffix = str(path).rpartition(".")
    if not dot or suffix not in ("pt", "h5"):
        raise DpsadError(f"{path}: no ledger sits beside it, expected a .pt or .h5 artifact")
    return f"{stem}.ledger.json"


def with_upstream_ledgers(**named_inputs):
    """An input function giving a rule's named inputs plus ``upstream_ledgers``, the ledger of each input except the
    prepared data.  Values are paths with wildcards or input functions of the wildcards; use with unpack()."""

    def inputs(wildcards):
        resolved = {name: spec(wildcards) if callable(spec) else spec.format(**wildcards)
                    for name, spec in named_inputs.items()}
        paths = [[v] if isinstance(v, str) else list(v) for v in resolved.values()]
        data = PREPARED_DATA.format(**wildcards)
        ledgers = [ledger_of(p) for group in paths for p in group if p != data]
        return resolved | {"upstream_ledgers": list(dict.fromkeys(ledgers))}

    return inputs


def generator_ledger(config: dict, wildcards) -> str:
    """The cumulative ledger of the model a run samples from: the account stage composes it."""
    return ledger_of(generator(config, wildcards))


RUN_OVERRIDE_SECTIONS = ("student", "dpdm", "dpgan", "pe", "sample")  # each digested below as the merged settings


def run_config_digest(config: dict, wildcards) -> str:
    """sha256 of the settings that shaped a run's synthetic data (stored in synthetic.h5).  The run's override
    sections enter as the merged settings they give, not as written: an override equal to the global value, or
    one of a section the run's method does not use, reruns neither its sampling nor its evaluation."""
    this = run(config, wildcards)
    kmeans, method, init = labels(config, wildcards) == "kmeans", this["method"], dpdm_init_teacher(config, this)
    reads_teacher = method != "pe" or pe_generator(config, wildcards) == run_teacher(config, wildcards)
    view = lambda settings_of, wanted: settings_of(config, wildcards) if method == wanted else None  # noqa: E731
    relevant = {
        "data": dataset_settings(config, wildcards), "diffusion": config["diffusion"],
        "labels": labels(config, wildcards), "moco": config["moco"] if kmeans and config["kmeans"]["features"] == "moco" else None,
        "kmeans": label_kmeans_settings(config, wildcards) if kmeans else None,
        "teacher": (teacher_settings(config, this["teacher"]).result_view()
                    if method in ("dpsad", "nonprivate", "public", "pe") and reads_teacher else None),
        "init_teacher": teacher_settings(config, init).result_view() if init else None,
        "run": {key: value for key, value in this.items() if key not in RUN_OVERRIDE_SECTIONS},
        "student": view(student, "dpsad"), "dpdm": dpdm(config, wildcards) if trains_dpdm(config, this) else None,
        "dpgan": view(dpgan, "dpgan"),
        **({"pe": pe(config, wildcards)} if method == "pe" else {}),
        "sample": sample(config, wildcards),
    }
    read = [name for name, used in ((this["teacher"], relevant["teacher"]), (init, init)) if used]
    if populations := sorted({config["teachers"][name]["population"] for name in read
                              if config["teachers"][name]["split"] == "population"}):
        # the PE runs whose populations taught it: their settings shaped this data too (a key only where one did,
        # so that no other run's digest, and no sampling built before, changes)
        relevant["populations"] = {name: run_config_digest(config, SimpleNamespace(dataset=wildcards.dataset, run=name))
                                   for name in populations}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()


def evaluate_settings(config: dict) -> dict:
    """The evaluate section without the Inception keys: giving weights to a finished workspace trains no
    classifier again (the figures are a stage of their own, :func:`inception_figures`)."""
    return {k: v for k, v in config["evaluate"].items() if k not in INCEPTION_KEYS}


def inception_settings(config: dict) -> dict:
    return {k: config["evaluate"][k] for k in (*INCEPTION_KEYS, "seed")}


def inception_figures(config: dict) -> list[str]:
    """Each dataset's inception.json, where weights are given; else none (the table says "not computed")."""
    weights = config["evaluate"]["inception_weights"]
    return [f"results/{dataset}/inception.json" for dataset in config["datasets"]] if weights else []


def synthetic_of_runs(config: dict, wildcards) -> list[str]:
    return [f"results/{wildcards.dataset}/{r['name']}/synthetic.h5" for r in config["runs"]]


def all_metrics(config: dict) -> list[str]:
    """metrics.json of every run on every dataset, plus each dataset's real reference row."""
    names = ["real", *(r["name"] for r in config["runs"])]
    return [f"results/{dataset}/{name}/metrics.json" for dataset in config["datasets"] for name in names]


def dataset_delta(config: dict, wildcards) -> float:
    """The delta a dataset's totals are stated at: its budget's, else the smallest of its runs'."""
    budget = config["data"][wildcards.dataset]["privacy_budget"]
    deltas = [r["delta"] for r in config["runs"] if r.get("delta")]
    return budget["delta"] if budget else min(deltas, default=1e-5)


def other_declaring_data(config: dict, wildcards) -> list[str]:
    """The data.h5 of every other dataset that declares an earlier use: the dataset's release_budget keeps those
    uses too, as their records may be these under another name, and its budget may run before theirs."""
    return [PREPARED_DATA.format(dataset=name) for name in config["datasets"]
            if name != wildcards.dataset and config["data"][name]["earlier_use"]]


def final_outputs(config: dict, release_outputs: list[str]) -> list[str]:
    """What ``all`` builds: the table, each dataset's spending, every run's data, grid and verdict, the cluster
    report where a run uses k-means labels, and ``release_outputs``."""
    outputs = ["results/comparison.csv", "results/comparison.md"]
    for dataset in config["datasets"]:
        outputs.append(f"results/{dataset}/spent.json")
        for r in config["runs"]:
            outputs += [f"results/{dataset}/{r['name']}/{name}" for name in ("synthetic.h5", "grid.png", "privacy.json")]
        if any(run_labels(config, r) == "kmeans" for r in config["runs"]):
            outputs.append(f"results/{dataset}/cluster_report.md")
    return outputs + release_outputs


def sweep_metrics(config: dict, wildcards) -> list[str]:
    """metrics.json of every sweep run, of the runs that are sweep points already, and of the public and
    nonprivate rows (the epsilon-0 floor and the no-noise ceiling)."""
    runs = sweep_runs(config) + sweep_points_among_runs(config)
    runs += [r for r in config["runs"] if r["method"] in ("public", "nonprivate")]
    return [f"results/{wildcards.dataset}/{r['name']}/metrics.json" for r in runs]


def audited_run(config: dict, wildcards) -> dict:
    return audit_run_by_name(config, wildcards.audited)


audit = result_view(method_settings, audited_run)


def audit_teacher(config: dict, wildcards) -> list[str]:
    """The teacher a DP-SAD run distils, or a warm-started DPDM run starts from."""
    audited = audited_run(config, wildcards)
    name = audited["teacher"] if audited["method"] == "dpsad" else dpdm_init_teacher(config, audited)
    return teacher_file(wildcards.dataset, name)


def audit_outputs(config: dict) -> list[str]:
    """audit.json of every run in audit.runs, for every dataset."""
    return [f"results/{dataset}/{name}/audit.json" for dataset in config["datasets"] for name in audit_run_names(config)]
