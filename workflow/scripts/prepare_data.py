"""prepare_data: read the configured source, split it, write data.h5."""
from dpsad.data.datafile import prepare
from dpsad.stage import run_stage


def main(snakemake, log):
    # From the config, not params: a changed delta must not rerun this rule, only be checked against n here.
    deltas = {run["name"]: float(run["delta"]) for run in snakemake.config["runs"]
              if run["method"] not in ("nonprivate", "public")}
    splits = prepare(snakemake.params.settings, snakemake.wildcards.dataset, snakemake.output[0], deltas=deltas)
    log.info("wrote %s: %s", snakemake.output[0], {name: len(split) for name, split in splits.items()})


run_stage(snakemake, main)  # noqa: F821
