"""What a rule's params may hold, so that reruns follow what a stage computes: the release and location
keys kept out of prepare_data's params, the execution-only keys kept out of every training's, sorted keys."""

from __future__ import annotations

from .stages import audit_run_by_name, method_settings, run_by_name, sorted_keys


# Keys that decide how a job runs, not what it computes.  They are kept out of the rules' params, so a
# change never reruns a stage (a rerun of a DP stage would read the private records again).
RELEASE_KEYS = ("privacy_budget", "release", "earlier_use")  # what leaves results/ and what it states, not what is computed


# Where the source files are, not what they hold: moving the data must not rerun prepare_data (and every DP
# stage after it).  What they hold is the stage's source_checksum parameter (dpsad.data.fingerprint).
LOCATION_KEYS = ("root", "path", "download")


def data_settings(section: dict) -> dict:
    """A ``data.<name>`` section without its release and location keys: what prepare_data's result depends on."""
    kept = {key: value for key, value in section.items() if key not in RELEASE_KEYS + LOCATION_KEYS}
    if isinstance(kept.get("public"), dict):
        kept["public"] = sorted_keys({k: v for k, v in kept["public"].items() if k not in LOCATION_KEYS})
    return sorted_keys(kept)


EXECUTION_ONLY_KEYS = ("checkpoint_every",)


# How per-example gradients are formed and in what chunks (memory, not the result; the noise is drawn once per
# step whatever the chunks): changing them, e.g. after a CUDA out-of-memory, must not rerun and spend again.
EXECUTION_ONLY_DP_KEYS = ("per_example", "precision", "microbatch_size")


def result_settings(settings: dict) -> dict:
    """``settings`` without the execution-only keys: what a rule's params (its rerun trigger) may hold.

    Keys are sorted (nested too): Snakemake compares params as text, so the order in which config files and
    ``--config`` were merged must not look like a change."""
    kept = {key: value for key, value in settings.items() if key not in EXECUTION_ONLY_KEYS}
    if isinstance(kept.get("dp"), dict):
        kept["dp"] = {key: value for key, value in kept["dp"].items() if key not in EXECUTION_ONLY_DP_KEYS}
    return sorted_keys(kept)


def execution_settings(config: dict, rule: str, wildcards) -> dict:
    """The execution-only keys of a training rule's settings, read from the config at run time.

    Which settings by the rule's name without a module prefix (``use rule * from dpsad as dpsad_*``)."""
    if rule.endswith("train_teacher"):
        full = config["teachers"][wildcards["teacher"]]
    else:  # distill_student, train_dpdm, train_dpgan, audit_run: the settings of the run's method
        audited = rule.endswith("audit_run")
        run = audit_run_by_name(config, wildcards["audited"]) if audited else run_by_name(config, wildcards["run"])
        full = method_settings(config, run)
    chosen = {key: full[key] for key in EXECUTION_ONLY_KEYS if key in full}
    if isinstance(full.get("dp"), dict):
        chosen["dp"] = {key: full["dp"][key] for key in EXECUTION_ONLY_DP_KEYS if key in full["dp"]}
    return chosen
