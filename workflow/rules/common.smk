# Configuration checks, resource requests and the input functions (get_*) the rule files share.
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

from dpsad.config import accountant_of, released_runs, run_labels  # noqa: E402
from dpsad.config import pe_simulates, sweep_runs, teacher_settings  # noqa: E402
from dpsad.config import inputs, validate_config  # noqa: E402
from dpsad.data.fingerprint import CACHE_PATH, content_checksum  # noqa: E402
from dpsad.errors import DpsadError  # noqa: E402
from dpsad.config import resources as job_resources  # noqa: E402
from dpsad.jobs.one_running_copy import export_snakemake_identity  # noqa: E402
from dpsad.jobs.preflight import folder_problem, stage_folders  # noqa: E402
from dpsad.privacy.books.curator_record import curator_folder, home_folder  # noqa: E402
from dpsad.privacy.books.curator_record import active_test_settings  # noqa: E402
from dpsad.privacy.epsilon_cache import CACHE_ENV  # noqa: E402
from dpsad.privacy.mechanism import code_digest  # noqa: E402
from snakemake.exceptions import WorkflowError  # noqa: E402

# A test setting left in a user's shell: said before any job, as every statement of a release says it.
for sentence in active_test_settings():
    print(f"warning: {sentence}", file=sys.stderr)
# Every job learns which Snakemake started it, so a job that outlives it stops (dpsad.jobs.one_running_copy).
export_snakemake_identity()
# The jobs that check a stated epsilon find it composed once (dpsad.privacy.epsilon_cache); an empty
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
SIM_PE_CODE = code_digest.sim_pe_code_sha256()


def get_pe_code(wildcards):
    """PE's mechanism digest, or Sim-PE's for a pe.simulator run (each reruns only its own runs)."""
    return SIM_PE_CODE if pe_simulates(config, get_run(wildcards)) else PE_CODE


def get_teacher_dp_code(wildcards):
    return DP_CODE if config["teachers"][wildcards.teacher]["privacy"] == "dp" else None


def get_dataset_delta_of_budget(wildcards):
    """The delta of the dataset's privacy budget (the warm-up is calibrated at it)."""
    budget = config["data"][wildcards.dataset].get("privacy_budget") or {}
    if budget.get("delta") is None:
        raise WorkflowError(
            f"data.{wildcards.dataset}.privacy_budget.delta is missing, expected the delta the central images "
            "are calibrated at"
        )
    return budget["delta"]


# Scheduler requests live in the rules, so a --set-resources for one rule (on the command line or in a profile)
# leaves the others alone, and a host workflow using these rules as a module keeps them.  Threads and GPU use:
# the workflow's table, workflow/resources.yaml; memory and runtime: estimated from the config and the data,
# growing with each retry (dpsad.config.resources).  cpus_per_task is the table's threads as a resource: Snakemake
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
        if rule_name == "train_pe" and not get_pe_generator(wildcards):
            return 0  # Sim-PE in pixels renders on the CPU and reads no model: no GPU to queue for
        return config["gpus_per_job"]

    return gpus


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


# The input functions of the rules (dpsad.config.inputs), bound to this configuration.  A training's params are
# the fields of its typed settings that shape the result (a change reruns the stage and, for a DP stage, spends
# budget again); execution-only fields (checkpoint_every, the per-example engine, ...) are not, and the script
# builds the whole object from the config (dpsad.jobs.stage.stage_settings).
def bound(function):
    return lambda wildcards: function(config, wildcards)


get_run = bound(inputs.run)
get_generator = bound(inputs.generator)
get_run_teacher = bound(inputs.run_teacher)
get_pe_generator = bound(inputs.pe_generator)
get_dataset_settings = bound(inputs.dataset_settings)
get_student_settings = bound(inputs.student)
get_dpdm_settings = bound(inputs.dpdm)
get_dpgan_settings = bound(inputs.dpgan)
get_pe_settings = bound(inputs.pe)
get_sample_settings = bound(inputs.sample)
get_audit_settings = bound(inputs.audit)
get_feature_teacher = bound(inputs.feature_teacher)
get_label_teacher = bound(inputs.label_teacher)
get_label_features = bound(inputs.label_features)
get_label_kmeans_settings = bound(inputs.label_kmeans_settings)
get_run_labels = bound(inputs.labels)
get_teacher_labels = bound(inputs.teacher_label_source)
get_pseudo_labels = bound(inputs.pseudo_labels)
get_teacher_pseudo_labels = bound(inputs.teacher_pseudo_labels)
get_dpdm_init = bound(inputs.dpdm_init)
get_teacher_init = bound(inputs.teacher_init)
get_teacher_central = bound(inputs.teacher_central)
get_teacher_population = bound(inputs.teacher_population)
get_generator_ledger = bound(inputs.generator_ledger)
get_run_config_digest = bound(inputs.run_config_digest)
get_synthetic_of_runs = bound(inputs.synthetic_of_runs)
get_dataset_delta = bound(inputs.dataset_delta)
get_other_declaring_data = bound(inputs.other_declaring_data)
get_sweep_metrics = bound(inputs.sweep_metrics)
get_audited_run = bound(inputs.audited_run)
get_audit_teacher = bound(inputs.audit_teacher)
with_upstream_ledgers = inputs.with_upstream_ledgers
PREPARED_DATA = inputs.PREPARED_DATA
RELEASE_CHECK = inputs.RELEASE_CHECK
EVALUATE_SETTINGS = inputs.evaluate_settings(config)
INCEPTION_SETTINGS = inputs.inception_settings(config)


def get_all_metrics():
    return inputs.all_metrics(config)


def get_inception_figures(wildcards=None):
    return inputs.inception_figures(config)


def get_final_outputs(wildcards=None):
    return inputs.final_outputs(config, get_release_outputs())


def get_audit_outputs(wildcards):
    return checked(inputs.audit_outputs, config)
