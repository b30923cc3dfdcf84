# Configuration checks and the input functions (get_*) the rule files share.
import hashlib
import json
import os
import re
import sys
from pathlib import Path

# The package of this checkout, for the Snakefile and (via PYTHONPATH) every job's script, not an editable install
# of another checkout.  Used as a module from a remote source there is no src/: the host's installed dpsad is used.
PACKAGE_ROOT = Path(str(workflow.current_basedir)).parents[1] / "src"
if (PACKAGE_ROOT / "dpsad" / "__init__.py").is_file():
    sys.path.insert(0, str(PACKAGE_ROOT))

    from dpsad.jobs.checkout import use_package_of

    use_package_of(str(PACKAGE_ROOT))

from dpsad.config import (  # noqa: E402
    accountant_of,
    audit_run_by_name,
    audit_run_names,
    data_settings,
    dpdm_settings,
    dpgan_settings,
    method_settings,
    pe_settings,
    released_runs,
    run_by_name,
    run_labels,
    sample_settings,
    student_settings,
    sweep_points_among_runs,
    sweep_runs,
    teacher_labels,
    teacher_settings,
    validate_config,
)
from dpsad.data.fingerprint import CACHE_PATH, content_checksum  # noqa: E402
from dpsad.errors import DpsadError  # noqa: E402
from dpsad.jobs import resources as job_resources  # noqa: E402
from dpsad.jobs.one_running_copy import export_snakemake_identity  # noqa: E402
from dpsad.jobs.preflight import folder_problem, stage_folders  # noqa: E402
from dpsad.privacy.books.curator_record import curator_folder, home_folder  # noqa: E402
from dpsad.privacy.books.epsilon_cache import CACHE_ENV  # noqa: E402
from dpsad.privacy.mechanism import code_digest  # noqa: E402
from snakemake.exceptions import WorkflowError  # noqa: E402

# Every job learns which Snakemake started it, so a job that outlives it stops (dpsad.jobs.one_running_copy).
export_snakemake_identity()
# The jobs that check a stated epsilon find it composed once (dpsad.privacy.books.epsilon_cache); an empty
# DPSAD_EPSILON_CACHE (or the former name, DPSAD_EPSILON_MEMO) turns that off.
os.environ.setdefault(
    CACHE_ENV,
    os.environ.get(
        "DPSAD_EPSILON_MEMO", str(Path(".snakemake", "dpsad-epsilons").resolve())
    ),
)


def config_error(err):
    """End Snakemake with ``error: <message>`` and exit code 1: a WorkflowError would add traceback lines."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


def checked(function, *args):
    """``function(*args)``; bad input (a DpsadError) ends Snakemake with its one line."""
    try:
        return function(*args)
    except DpsadError as err:
        config_error(err)


# The checkout's schema where there is one: source_path copies it to a temporary file first, which a file-size
# limit (ulimit -f) below the schema's size stops with a traceback.
SCHEMA = Path(str(workflow.current_basedir)).parent / "schemas" / "config.schema.yaml"
if not SCHEMA.is_file():
    SCHEMA = workflow.source_path("../schemas/config.schema.yaml")
checked(validate_config, config, str(SCHEMA))
SWEEP_RUNS = sweep_runs(config)
RUN_NAMES = [run["name"] for run in config["runs"] + SWEEP_RUNS]
# A file where an output folder goes would stop Snakemake inside its own code, with a traceback.
if problem := folder_problem(stage_folders(config["datasets"], RUN_NAMES), False):
    config_error(problem)


# A folder the jobs cannot write (a read-only file system, no permission) stops Snakemake inside its own code,
# with a traceback, when it removes an old output or creates a folder: said in one line before any job starts.
onstart:
    written = [
        Path(str(path)).parent
        for job in workflow.dag.needrun_jobs()
        for path in [
            *job.output,
            *job.log,
            *([job.benchmark] if job.benchmark else []),
        ]
    ]
    if problem := folder_problem(dict.fromkeys(written)):
        config_error(problem)


# A curator's record folder a release cannot write (the user's own, config curator_dir), found only by
# release_budget, would stop the release after every DP stage had trained on the private records: said in the
# main process (a dry run too) when the configuration releases anything.
if workflow.is_main_process and any(
    config["data"][name]["release"] for name in config["datasets"]
):
    if problem := folder_problem(
        checked(lambda: {curator_folder(config["curator_dir"]), home_folder()})
    ):
        config_error(problem)


wildcard_constraints:
    dataset="|".join(map(re.escape, config["datasets"])),
    run="|".join(map(re.escape, RUN_NAMES)),
    teacher="|".join(map(re.escape, config["teachers"])),


def get_run(wildcards):
    return run_by_name(config, wildcards.run)


def get_dataset_settings(wildcards):
    """How the data is prepared: the dataset's section without what decides its release or where its
    files are (no rerun)."""
    return data_settings(config["data"][wildcards.dataset])


SOURCE_CHECKSUMS = {}


def get_source_checksum(wildcards):
    """sha256 of the source files' content (None for sources bundled in packages): a replaced file reruns
    prepare_data, a moved folder does not (dpsad.data.fingerprint)."""
    if wildcards.dataset not in SOURCE_CHECKSUMS:
        SOURCE_CHECKSUMS[wildcards.dataset] = content_checksum(
            config["data"][wildcards.dataset], CACHE_PATH
        )
    return SOURCE_CHECKSUMS[wildcards.dataset]


# The code of the DP mechanism (per-example gradients, clipping, noise, its calibration) is a param of every DP
# stage: a change to it reruns them.  No other code change reruns anything: the workflow profile leaves out
# Snakemake's code trigger, which would retrain every DP stage after a touch, a git pull or a copy of a script.
DP_CODE = code_digest.mechanism_code_sha256()
CENTRAL_CODE = code_digest.central_code_sha256()
PE_CODE = code_digest.pe_code_sha256()


def get_teacher_dp_code(wildcards):
    return DP_CODE if config["teachers"][wildcards.teacher]["privacy"] == "dp" else None


# A training's params are the fields of its typed settings that shape the result (a change reruns the stage
# and, for a DP stage, spends budget again); the fields marked execution-only (checkpoint_every, the
# per-example engine, ...) are not, and the script builds the whole object from the config
# (dpsad.jobs.stage.stage_settings).
def result_view_of(settings_of, run_of=get_run):
    """An input function: the result fields of ``settings_of(config, <the job's run>)``."""
    return lambda wildcards: settings_of(config, run_of(wildcards)).result_view()


get_student_settings = result_view_of(student_settings)
get_dpdm_settings = result_view_of(dpdm_settings)
get_dpgan_settings = result_view_of(dpgan_settings)
get_pe_settings = result_view_of(pe_settings)


def get_sample_settings(wildcards):
    return sample_settings(config, get_run(wildcards))


def teacher_file(dataset, name):
    """The checkpoint of teacher ``name`` as a list of inputs (none without a name)."""
    return [f"results/{dataset}/teacher/{name}.pt"] if name else []


def get_run_teacher(wildcards):
    return f"results/{wildcards.dataset}/teacher/{get_run(wildcards)['teacher']}.pt"


GENERATOR_FILES = {"dpsad": "student", "dpdm": "dpdm", "dpgan": "dpgan", "pe": "pe"}


def get_generator(wildcards):
    """The checkpoint a run samples from: the student for DP-SAD, the teacher-style model otherwise."""
    name = GENERATOR_FILES.get(get_run(wildcards)["method"])
    if name:
        return f"results/{wildcards.dataset}/{wildcards.run}/{name}.pt"
    return get_run_teacher(wildcards)


def get_feature_teacher(wildcards):
    """The public teacher whose encoder features k-means also clusters (kmeans.teacher), else nothing."""
    return teacher_file(wildcards.dataset, config["kmeans"]["teacher"])


def get_label_teacher(wildcards):
    """The teacher whose encoder features the labels are fitted on (kmeans.features: teacher), else nothing."""
    uses_teacher = config["kmeans"]["features"] == "teacher"
    return get_feature_teacher(wildcards) if uses_teacher else []


def get_label_kmeans_settings(wildcards):
    """The k-means settings that shape the labels: kmeans.teacher only when the labels use its features (else it
    adds a row to the cluster report, and changing it must not rerun the labels and the DP stages after them).
    """
    uses_teacher = config["kmeans"]["features"] == "teacher"
    return {k: v for k, v in config["kmeans"].items() if k != "teacher" or uses_teacher}


def get_run_labels(wildcards):
    """The run's label source: true, kmeans or none."""
    return run_labels(config, get_run(wildcards))


def get_teacher_labels(wildcards):
    return teacher_labels(config, wildcards.teacher)


def pseudo_label_files(dataset, label_source):
    """labels.h5 of the k-means stage for a kmeans label source, else nothing."""
    return [f"results/{dataset}/labels.h5"] if label_source == "kmeans" else []


def get_pseudo_labels(wildcards):
    return pseudo_label_files(wildcards.dataset, get_run_labels(wildcards))


def get_teacher_pseudo_labels(wildcards):
    return pseudo_label_files(wildcards.dataset, get_teacher_labels(wildcards))


def dpdm_init_teacher(run):
    """The public teacher a DPDM run starts from (``dpdm.init``), or None."""
    init = dpdm_settings(config, run).init if run["method"] == "dpdm" else "scratch"
    return None if init == "scratch" else init


def get_dpdm_init(wildcards):
    return teacher_file(wildcards.dataset, dpdm_init_teacher(get_run(wildcards)))


def get_teacher_init(wildcards):
    """The public teacher a teacher starts from (``teachers.<name>.init``), else nothing."""
    init = config["teachers"][wildcards.teacher]["init"]
    return teacher_file(wildcards.dataset, None if init == "scratch" else init)


def get_teacher_central(wildcards):
    """The central images of the DP warm-up when the teacher trains on them (``split: central``), else nothing."""
    central = config["teachers"][wildcards.teacher]["split"] == "central"
    return [f"results/{wildcards.dataset}/central.h5"] if central else []


def get_dataset_delta_of_budget(wildcards):
    """The delta of the dataset's privacy budget (the warm-up is calibrated at it)."""
    budget = config["data"][wildcards.dataset].get("privacy_budget") or {}
    if budget.get("delta") is None:
        raise WorkflowError(
            f"data.{wildcards.dataset}.privacy_budget.delta is missing, expected the delta the central images "
            "are calibrated at"
        )
    return budget["delta"]


# Provenance.  Every artifact a stage builds from carries a cumulative ledger beside it (X.pt or X.h5 ->
# X.ledger.json): its own use of private records and those of everything it was built from.  A stage that
# writes a ledger takes its inputs through with_upstream_ledgers, so the ledgers it composes are derived
# from the very input functions that build the DAG: a new input cannot be forgotten in a second list.
PREPARED_DATA = "results/{dataset}/data.h5"  # the private records themselves: each reading stage accounts for them


def ledger_of(path):
    """The cumulative ledger beside an artifact: results/.../X.pt (or .h5) -> results/.../X.ledger.json."""
    stem, dot, suffix = str(path).rpartition(".")
    if not dot or suffix not in ("pt", "h5"):
        raise WorkflowError(
            f"{path}: no ledger sits beside it, expected a .pt or .h5 artifact"
        )
    return f"{stem}.ledger.json"


def with_upstream_ledgers(**named_inputs):
    """A rule's named inputs plus ``upstream_ledgers``, the ledger of each input except the prepared data.

    Values are paths with wildcards or input functions, as in an input section; use with unpack().
    """

    def inputs(wildcards):
        resolved = {
            name: spec(wildcards) if callable(spec) else spec.format(**wildcards)
            for name, spec in named_inputs.items()
        }
        paths = [[v] if isinstance(v, str) else list(v) for v in resolved.values()]
        data = PREPARED_DATA.format(**wildcards)
        ledgers = [ledger_of(p) for group in paths for p in group if p != data]
        return resolved | {"upstream_ledgers": list(dict.fromkeys(ledgers))}

    return inputs


def get_generator_ledger(wildcards):
    """The cumulative ledger of the model a run samples from: the account stage composes it."""
    return ledger_of(get_generator(wildcards))


# Scheduler requests live in the rules, so a --set-resources for one rule (on the command line or in a profile)
# leaves the others alone, and a host workflow using these rules as a module keeps them.  Threads and GPU use:
# the workflow's table, workflow/resources.yaml; memory and runtime: estimated from the config and the data,
# growing with each retry (dpsad.jobs.resources).  cpus_per_task is the table's threads as a resource: Snakemake
# caps threads at the submitting machine's cores, not resources; inside SLURM a job uses what it was given.
RULE_TABLE = job_resources.RuleTable.read(
    Path(str(workflow.current_basedir)).parent / "resources.yaml"
)


def rule_threads(rule_name):
    """A rule's threads in this run: the table's, shared so that two jobs run side by side on this machine (the
    table's where no cores were given: a host workflow's dry run)."""
    try:
        cores = workflow.cores
    except WorkflowError:
        cores = None
    return RULE_TABLE.local_threads(rule_name, cores)


def rule_cpus(rule_name):
    return RULE_TABLE.rule_threads(rule_name)


def requested(rule_name, what):
    """Resource function: the job's ``what`` (mem_mb or runtime) for its attempt."""

    def request(wildcards, attempt):
        data = Path(PREPARED_DATA.format(dataset=wildcards.dataset))
        shape = job_resources.read_prepared_shape(data)
        shape = shape or job_resources.configured_shape(
            config["data"][wildcards.dataset]
        )
        estimate = job_resources.job_request(
            config, rule_name, dict(wildcards.items()), shape, RULE_TABLE
        )
        return job_resources.attempt_request(getattr(estimate, what), attempt, what)

    return request


def requested_gpus(rule_name):
    """Resource function: gpus_per_job for a rule the table gives a GPU, but 0 where the command line or a profile
    gives the rule (by its name here, a module's alias) a ``gres``, so that sbatch never gets both.
    """

    def gpus(wildcards, rulename):
        given = workflow.resource_settings.overwrite_resources.get(rulename) or {}
        defaults = workflow.resource_settings.default_resources or {}
        if "gres" in given or "gres" in defaults or not RULE_TABLE.uses_gpu(rule_name):
            return 0
        return config["gpus_per_job"]

    return gpus


def get_run_config_digest(wildcards):
    """sha256 of the settings that shaped a run's synthetic data (stored in synthetic.h5)."""
    run, kmeans = get_run(wildcards), get_run_labels(wildcards) == "kmeans"
    method, init = run["method"], dpdm_init_teacher(run)
    teacher = method in ("dpsad", "nonprivate", "public", "pe")
    relevant = {
        "data": get_dataset_settings(wildcards),
        "diffusion": config["diffusion"],
        "labels": get_run_labels(wildcards),
        "moco": config["moco"] if kmeans else None,
        "kmeans": get_label_kmeans_settings(wildcards) if kmeans else None,
        "teacher": (
            teacher_settings(config, run["teacher"]).result_view() if teacher else None
        ),
        "init_teacher": teacher_settings(config, init).result_view() if init else None,
        "run": run,
        "student": get_student_settings(wildcards) if method == "dpsad" else None,
        "dpdm": get_dpdm_settings(wildcards) if method == "dpdm" else None,
        "dpgan": get_dpgan_settings(wildcards) if method == "dpgan" else None,
        **({"pe": get_pe_settings(wildcards)} if method == "pe" else {}),
        "sample": get_sample_settings(wildcards),
    }
    text = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def get_all_metrics():
    """metrics.json of every run on every dataset, plus each dataset's real reference row."""
    names = ["real", *(run["name"] for run in config["runs"])]
    return [f"results/{d}/{n}/metrics.json" for d in config["datasets"] for n in names]


def dataset_release(dataset):
    """The runs ``data.<dataset>.release`` lists; a name that is not a configured run is a one-line error."""
    return checked(released_runs, config, dataset)


def get_release_outputs(wildcards=None):
    """Each dataset's BUDGET.json and the folder of every run its ``release`` list names."""
    outputs = []
    for dataset in config["datasets"]:
        runs = dataset_release(dataset)
        outputs += [f"release/{dataset}/BUDGET.json"] if runs else []
        outputs += [f"release/{dataset}/{run}" for run in runs]
    return outputs


def get_released_privacy(wildcards):
    runs = dataset_release(wildcards.dataset)
    return [f"results/{wildcards.dataset}/{run}/privacy.json" for run in runs]


def get_release_budget(wildcards):
    """BUDGET.json, which a run's release waits for; a run the list does not name is never released."""
    runs = dataset_release(wildcards.dataset)
    if wildcards.run not in runs:
        config_error(
            f"run '{wildcards.run}' is not in data.{wildcards.dataset}.release ({', '.join(runs) or 'empty'}), "
            "expected a listed run: only listed runs leave results/"
        )
    # ancient: a later change of the total (another run listed) does not rebuild the releases made before it
    return ancient(f"release/{wildcards.dataset}/BUDGET.json")


def get_dataset_delta(wildcards):
    """The delta a dataset's totals are stated at: its budget's, else the smallest of its runs'."""
    budget = config["data"][wildcards.dataset]["privacy_budget"]
    deltas = [run["delta"] for run in config["runs"] if run.get("delta")]
    return budget["delta"] if budget else min(deltas, default=1e-5)


def get_final_outputs(wildcards=None):
    outputs = ["results/comparison.csv", "results/comparison.md"]
    for dataset in config["datasets"]:
        outputs.append(f"results/{dataset}/spent.json")
        for run in config["runs"]:
            outputs += [
                f"results/{dataset}/{run['name']}/{name}"
                for name in ("synthetic.h5", "grid.png", "privacy.json")
            ]
        if any(run_labels(config, run) == "kmeans" for run in config["runs"]):
            outputs.append(f"results/{dataset}/cluster_report.md")
    return outputs + get_release_outputs()


# The sweep target (workflow/rules/evaluate.smk).
def get_sweep_metrics(wildcards):
    """metrics.json of every sweep run, of the runs that are sweep points already, and of the public and
    nonprivate rows (the epsilon-0 floor and the no-noise ceiling)."""
    runs = SWEEP_RUNS + sweep_points_among_runs(config)
    runs += [run for run in config["runs"] if run["method"] in ("public", "nonprivate")]
    return [f"results/{wildcards.dataset}/{run['name']}/metrics.json" for run in runs]


# The audit target (workflow/rules/audit.smk).
def get_audited_run(wildcards):
    return audit_run_by_name(config, wildcards.audited)


get_audit_settings = result_view_of(method_settings, get_audited_run)


def get_audit_teacher(wildcards):
    """The teacher a DP-SAD run distils, or a warm-started DPDM run starts from."""
    run = get_audited_run(wildcards)
    teacher = run["teacher"] if run["method"] == "dpsad" else dpdm_init_teacher(run)
    return teacher_file(wildcards.dataset, teacher)


def get_audit_outputs(wildcards):
    """audit.json of every run in audit.runs, for every dataset."""
    return expand(
        "results/{dataset}/{audited}/audit.json",
        dataset=config["datasets"],
        audited=checked(audit_run_names, config),
    )
