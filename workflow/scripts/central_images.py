"""central_images: the DP warm-up, noisy means of disjoint groups of private records (see dpsad.privacy.central)."""
from dpsad.data.central import build_central_images
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    build_central_images(snakemake.input.data, snakemake.output.images, snakemake.output.ledger,
                         snakemake.params.settings, snakemake.params.delta, log)


run_stage(snakemake, main)  # noqa: F821
