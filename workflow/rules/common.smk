# Configuration checks and the input functions (get_*) every rule file uses.
import hashlib
import os
import re
import json
import sys
from pathlib import Path

# The package of this checkout, for the Snakefile and (via PYTHONPATH) every job's script.  Found from this
# file (workflow.basedir is the host's folder when dpsad is a module).  Used as a module from a remote source,
# the workflow has no local src/: the host environment's installed dpsad is used.
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
from snakemake.exceptions import WorkflowError  # noqa: E402
from dpsad.jobs.guard import export_snakemake_identity  # noqa: E402
from dpsad.privacy.books.epsilon_cache import (  # noqa: E402
    CACHE_ENV as EPSILON_CACHE_ENV,
)
from dpsad.privacy.books.curator_record import curator_folder, home_folder  # noqa: E402
from dpsad.jobs.preflight import (  # noqa: E402
    output_folder_problem,
    stage_folders,
    work_folder_problem,
)
from dpsad.privacy.mechanism.code import (  # noqa: E402
    central_code_sha256,
    mechanism_code_sha256,
    pe_code_sha256,
)
from dpsad.jobs.resources import (  # noqa: E402
    RuleTable,
    attempt_request,
    configured_shape,
    job_request,
    read_prepared_shape,
)

# Every job learns which Snakemake started it, so a job that outlives it stops (src/dpsad/jobs/guard.py).
export_snakemake_identity()

# The jobs that check a stated epsilon find it composed once (src/dpsad/privacy/books/epsilon_cache.py); an empty
# DPSAD_EPSILON_CACHE (or the former name, DPSAD_EPSILON_MEMO) turns that off.
os.environ.setdefault(
    EPSILON_CACHE_ENV,
    os.environ.get(
        "DPSAD_EPSILON_MEMO", str(Path(".snakemake", "dpsad-epsilons").resolve())
    ),
)


def config_error(err):
    """End Snakemake with ``error: <message>`` and exit code 1: a WorkflowError would add traceback lines."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


try:
    validate_config(config, workflow.source_path("../schemas/config.schema.yaml"))
except DpsadError as err:
    config_error(err)

SWEEP_RUNS = sweep_runs(config)
RUN_NAMES = [run["name"] for run in config["runs"] + SWEEP_RUNS]
# A file where an output folder goes would stop Snakemake inside its own code, with a traceback.
FOLDER_PROBLEM = work_folder_problem(
    Path.cwd(), stage_folders(config["datasets"], RUN_NAMES), writable=False
)
if FOLDER_PROBLEM:
    config_error(FOLDER_PROBLEM)


def files_jobs_write(dag):
    """The outputs, logs and benchmark files of the jobs this run will execute."""
    for job in dag.needrun_jobs():
        yield from (str(f) for f in job.output)
        yield from (str(f) for f in job.log)
        if job.benchmark:
            yield str(job.benchmark)


# A folder the jobs cannot write (a read-only file system, no permission) stops Snakemake inside its own code,
# with a traceback, when it removes an old output or creates a folder: said in one line before any job starts.
onstart:
    if problem := output_folder_problem(files_jobs_write(workflow.dag)):
        config_error(problem)


# A curator's record folder a release cannot write (the user's own, config curator_dir), found only by
# release_budget, would stop the release after every DP stage had trained on the private records: said in the
# main process (a dry run too) when the configuration releases anything.
if workflow.is_main_process and any(
    config["data"][name]["release"] for name in config["datasets"]
):
    try:
        RECORD_FOLDERS = {curator_folder(config["curator_dir"]), home_folder()}
    except DpsadError as err:
        config_error(err)
    if problem := output_folder_problem(
        str(folder / "curator.sqlite") for folder in RECORD_FOLDERS
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
    """sha256 of the source files' content (None for sources bundled in packages): what the data holds,
    so a replaced file reruns prepare_data and a moved folder does not (dpsad.data.fingerprint).
    """
    if wildcards.dataset not in SOURCE_CHECKSUMS:
        SOURCE_CHECKSUMS[wildcards.dataset] = content_checksum(
            config["data"][wildcards.dataset], CACHE_PATH
        )
    return SOURCE_CHECKSUMS[wildcards.dataset]


# The code of the DP mechanism (per-example gradients, clipping, noise, its calibration) is a param of every DP
# stage: a change to it reruns them.  No other code change reruns anything: the workflow profile leaves out
# Snakemake's code trigger, which would retrain every DP stage after a touch, a git pull or a copy of a script.
DP_CODE = mechanism_code_sha256()
CENTRAL_CODE = central_code_sha256()
PE_CODE = pe_code_sha256()


def get_teacher_dp_code(wildcards):
    return DP_CODE if config["teachers"][wildcards.teacher]["privacy"] == "dp" else None


# A training's params are the fields of its typed settings that shape the result (a change reruns the stage
# and, for a DP stage, spends budget again); the fields marked execution-only (checkpoint_every, the
# per-example engine, ...) are not, and the script builds the whole object from the config
# (dpsad.jobs.stage.stage_settings).
def get_teacher_settings(wildcards):
    return teacher_settings(config, wildcards.teacher).result_view()


def get_student_settings(wildcards):
    return student_settings(config, get_run(wildcards)).result_view()


def get_dpdm_settings(wildcards):
    return dpdm_settings(config, get_run(wildcards)).result_view()


def get_sample_settings(wildcards):
    return sample_settings(config, get_run(wildcards))


def get_run_teacher(wildcards):
    return f"results/{wildcards.dataset}/teacher/{get_run(wildcards)['teacher']}.pt"


def get_generator(wildcards):
    """The checkpoint a run samples from: the student for DP-SAD, the teacher-style model otherwise."""
    run = get_run(wildcards)
    if run["method"] in GENERATOR_FILES:
        return f"results/{wildcards.dataset}/{wildcards.run}/{GENERATOR_FILES[run['method']]}.pt"
    return get_run_teacher(wildcards)


GENERATOR_FILES = {"dpsad": "student", "dpdm": "dpdm", "dpgan": "dpgan", "pe": "pe"}


def pseudo_label_files(dataset, label_source):
    """labels.h5 of the k-means stage for a kmeans label source, else nothing."""
    return [f"results/{dataset}/labels.h5"] if label_source == "kmeans" else []


def get_feature_teacher(wildcards):
    """The public teacher whose encoder features k-means also clusters (kmeans.teacher), else nothing."""
    name = config["kmeans"]["teacher"]
    return [f"results/{wildcards.dataset}/teacher/{name}.pt"] if name else []


def get_label_teacher(wildcards):
    """The teacher whose encoder features the labels are fitted on (kmeans.features: teacher), else nothing."""
    return (
        get_feature_teacher(wildcards)
        if config["kmeans"]["features"] == "teacher"
        else []
    )


def get_label_kmeans_settings(wildcards):
    """The k-means settings that shape the labels: kmeans.teacher only when the labels use its features (else it
    adds a row to the cluster report, and changing it must not rerun the labels and the DP stages after them).
    """
    settings = dict(config["kmeans"])
    if settings["features"] != "teacher":
        settings.pop("teacher")
    return settings


def get_run_labels(wildcards):
    """The run's label source: true, kmeans or none."""
    return run_labels(config, get_run(wildcards))


def get_teacher_labels(wildcards):
    return teacher_labels(config, wildcards.teacher)


def get_pseudo_labels(wildcards):
    """labels.h5 when the run uses k-means labels, else nothing."""
    return pseudo_label_files(wildcards.dataset, get_run_labels(wildcards))


def get_teacher_pseudo_labels(wildcards):
    return pseudo_label_files(wildcards.dataset, get_teacher_labels(wildcards))


def dpdm_init_teacher(run):
    """The public teacher a DPDM run starts from (``dpdm.init``), or None."""
    if run["method"] != "dpdm":
        return None
    init = dpdm_settings(config, run).init
    return None if init == "scratch" else init


def get_dpdm_init(wildcards):
    """The teacher checkpoint a warm-started DPDM run starts from, else nothing."""
    init = dpdm_init_teacher(get_run(wildcards))
    return [f"results/{wildcards.dataset}/teacher/{init}.pt"] if init else []


def get_teacher_central(wildcards):
    """The central images of the DP warm-up when the teacher trains on them (``split: central``), else nothing."""
    if config["teachers"][wildcards.teacher]["split"] != "central":
        return []
    return [f"results/{wildcards.dataset}/central.h5"]


def get_dataset_delta_of_budget(wildcards):
    """The delta of the dataset's privacy budget (the warm-up is calibrated at it)."""
    budget = config["data"][wildcards.dataset].get("privacy_budget") or {}
    if budget.get("delta") is None:
        raise WorkflowError(
            f"data.{wildcards.dataset}.privacy_budget.delta is missing, expected the delta the central images "
            "are calibrated at"
        )
    return budget["delta"]


def get_teacher_init(wildcards):
    """The public teacher checkpoint a teacher starts from (``teachers.<name>.init``), else nothing."""
    init = config["teachers"][wildcards.teacher]["init"]
    return (
        [] if init == "scratch" else [f"results/{wildcards.dataset}/teacher/{init}.pt"]
    )


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


def as_file_list(value):
    return [value] if isinstance(value, str) else list(value)


def with_upstream_ledgers(**named_inputs):
    """A rule's named inputs plus ``upstream_ledgers``, the ledger of each input except the prepared data.

    Values are paths with wildcards or input functions, as in an input section; use with unpack().
    """

    def inputs(wildcards):
        resolved = {
            name: spec(wildcards) if callable(spec) else spec.format(**wildcards)
            for name, spec in named_inputs.items()
        }
        data = PREPARED_DATA.format(**wildcards)
        ledgers = [
            ledger_of(path)
            for value in resolved.values()
            for path in as_file_list(value)
            if path != data
        ]
        return resolved | {"upstream_ledgers": list(dict.fromkeys(ledgers))}

    return inputs


def get_generator_ledger(wildcards):
    """The cumulative ledger of the model a run samples from: the account stage composes it."""
    return ledger_of(get_generator(wildcards))


def get_accountant(wildcards):
    return accountant_of(config, get_run(wildcards))


def get_dpgan_settings(wildcards):
    return dpgan_settings(config, get_run(wildcards)).result_view()


def get_pe_settings(wildcards):
    return pe_settings(config, get_run(wildcards)).result_view()


def get_audit_settings(wildcards):
    return method_settings(config, get_audited_run(wildcards)).result_view()


# Scheduler requests live in the rules, so a --set-resources for one rule (on the command line or in a
# profile) leaves the others alone, and a host workflow using these rules as a module keeps them.
# Memory and runtime are estimated from the config and the prepared data (dpsad.jobs.resources) and grow with
# each retry, so a job that ran out of either is not resubmitted identically.
# CPUs: cpus_per_task is the rule's threads as a resource: Snakemake caps threads at the submitting machine's
# cores (a 2-core login node would give a GPU job 2), not resources; inside SLURM a job uses what it was given.
# GPUs: config gpus_per_job for every job that computes on a device (training, MoCo features, k-means on
# teacher features, sampling, audits); a job that asked for a GPU and finds no CUDA stops at once
# (dpsad.jobs.devices).  A `gres` given by set-resources or default-resources names the GPUs instead, and
# `gpu` is then 0, so sbatch never gets both.
def dataset_shape(dataset):
    """Records and image shape of a dataset: from its data.h5 once prepared, else estimated from the config."""
    prepared = read_prepared_shape(Path(PREPARED_DATA.format(dataset=dataset)))
    return prepared or configured_shape(config["data"][dataset])


# Each rule's threads and whether it asks for GPUs: the workflow's table, workflow/resources.yaml.
RULE_TABLE = RuleTable.read(
    Path(str(workflow.current_basedir)).parent / "resources.yaml"
)


def run_cores():
    """The cores of this run (--cores; the workflow profile says all), or None where none were given (a host
    workflow's dry run)."""
    try:
        return workflow.cores
    except WorkflowError:
        return None


def rule_threads(rule_name):
    """A rule's threads in this run: the table's, shared so that two jobs run side by side on this machine."""
    return RULE_TABLE.local_threads(rule_name, run_cores())


def rule_cpus(rule_name):
    """The CPUs a rule's SLURM job asks for (resource cpus_per_task): the table's threads."""
    return RULE_TABLE.rule_threads(rule_name)


def requested(rule_name, what):
    """Resource function: the job's ``what`` (mem_mb or runtime) for its attempt."""

    def request(wildcards, attempt):
        estimate = job_request(
            config,
            rule_name,
            dict(wildcards.items()),
            dataset_shape(wildcards.dataset),
            RULE_TABLE,
        )
        return attempt_request(getattr(estimate, what), attempt, what)

    return request


def user_set_gres(rulename):
    """True when the command line or a profile gives ``gres`` to this rule (by its name here, aliases included)."""
    settings = workflow.resource_settings
    overwrite = settings.overwrite_resources.get(rulename) or {}
    defaults = settings.default_resources or {}
    return "gres" in overwrite or "gres" in defaults


def requested_gpus(rule_name):
    """Resource function: gpus_per_job for a rule the table gives a GPU, unless a gres names the GPUs."""

    # rulename: the rule's name here (a module's alias included)
    def gpus(wildcards, rulename):
        if user_set_gres(rulename) or not RULE_TABLE.uses_gpu(rule_name):
            return 0
        return config["gpus_per_job"]

    return gpus


def get_run_config_digest(wildcards):
    """sha256 of the settings that shaped a run's synthetic data (stored in synthetic.h5)."""
    run = get_run(wildcards)
    relevant = {
        "data": get_dataset_settings(wildcards),
        "diffusion": config["diffusion"],
        "labels": get_run_labels(wildcards),
        "moco": config["moco"] if get_run_labels(wildcards) == "kmeans" else None,
        "kmeans": (
            get_label_kmeans_settings(wildcards)
            if get_run_labels(wildcards) == "kmeans"
            else None
        ),
        "teacher": (
            teacher_settings(config, run["teacher"]).result_view()
            if run["method"] in ("dpsad", "nonprivate", "public", "pe")
            else None
        ),
        "init_teacher": (
            teacher_settings(config, dpdm_init_teacher(run)).result_view()
            if dpdm_init_teacher(run)
            else None
        ),
        "run": run,
        "student": (
            get_student_settings(wildcards) if run["method"] == "dpsad" else None
        ),
        "dpdm": get_dpdm_settings(wildcards) if run["method"] == "dpdm" else None,
        "dpgan": get_dpgan_settings(wildcards) if run["method"] == "dpgan" else None,
        **({"pe": get_pe_settings(wildcards)} if run["method"] == "pe" else {}),
        "sample": get_sample_settings(wildcards),
    }
    return hashlib.sha256(
        json.dumps(relevant, sort_keys=True, default=str).encode()
    ).hexdigest()


def get_all_metrics():
    """metrics.json of every run on every dataset, plus each dataset's real reference row."""
    metrics = []
    for dataset in config["datasets"]:
        metrics.append(f"results/{dataset}/real/metrics.json")
        metrics += [
            f"results/{dataset}/{run['name']}/metrics.json" for run in config["runs"]
        ]
    return metrics


def dataset_release(dataset):
    """The runs ``data.<dataset>.release`` lists; a name that is not a configured run is a one-line error."""
    try:
        return released_runs(config, dataset)
    except DpsadError as err:
        config_error(err)


def get_release_outputs(wildcards=None):
    """Each dataset's BUDGET.json and the folder of every run its ``release`` list names."""
    outputs = []
    for dataset in config["datasets"]:
        runs = dataset_release(dataset)
        if runs:
            outputs.append(f"release/{dataset}/BUDGET.json")
        outputs += [f"release/{dataset}/{run}" for run in runs]
    return outputs


def get_released_privacy(wildcards):
    return [
        f"results/{wildcards.dataset}/{run}/privacy.json"
        for run in dataset_release(wildcards.dataset)
    ]


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


def get_dataset_privacy(wildcards):
    """privacy.json of every configured run of a dataset: each is written after the run's last training."""
    return [
        f"results/{wildcards.dataset}/{run['name']}/privacy.json"
        for run in config["runs"]
    ]


def get_dataset_delta(wildcards):
    """The delta a dataset's totals are stated at: its budget's, else the smallest of its runs'."""
    budget = config["data"][wildcards.dataset]["privacy_budget"]
    if budget:
        return budget["delta"]
    return min(
        (run["delta"] for run in config["runs"] if run.get("delta")), default=1e-5
    )


def get_final_outputs(wildcards=None):
    outputs = ["results/comparison.csv", "results/comparison.md"]
    for dataset in config["datasets"]:
        outputs.append(f"results/{dataset}/spent.json")
        for run in config["runs"]:
            outputs += [
                f"results/{dataset}/{run['name']}/synthetic.h5",
                f"results/{dataset}/{run['name']}/grid.png",
                f"results/{dataset}/{run['name']}/privacy.json",
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


def get_audit_teacher(wildcards):
    """The teacher a DP-SAD run distils, or a warm-started DPDM run starts from."""
    run = get_audited_run(wildcards)
    teacher = run["teacher"] if run["method"] == "dpsad" else dpdm_init_teacher(run)
    return [f"results/{wildcards.dataset}/teacher/{teacher}.pt"] if teacher else []


def get_audit_labels(wildcards):
    return run_labels(config, get_audited_run(wildcards))


def get_audit_outputs(wildcards):
    """audit.json of every run in audit.runs, for every dataset."""
    try:
        names = audit_run_names(config)
    except DpsadError as err:
        config_error(err)
    return expand(
        "results/{dataset}/{audited}/audit.json",
        dataset=config["datasets"],
        audited=names,
    )
