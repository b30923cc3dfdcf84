"""prepare_data: read the configured source, split it, write data.h5."""
from dpsad.data.datafile import prepare
from dpsad.stage import run_stage


def main(snakemake, log):
    splits = prepare(snakemake.params.settings, snakemake.wildcards.dataset, snakemake.output[0])
    log.info("wrote %s: %s", snakemake.output[0], {name: len(split) for name, split in splits.items()})


run_stage(snakemake, main)  # noqa: F821
