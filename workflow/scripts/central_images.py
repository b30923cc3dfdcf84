"""central_images: the DP warm-up, noisy means of disjoint groups of private records (see dpsad.privacy.mechanism.group_means)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.central_split import build_central_images
from dpsad.jobs.stage import run_stage
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    build_central_images(snakemake.input.data, snakemake.output.images, snakemake.output.ledger,
                         snakemake.params.settings, snakemake.params.delta, log)


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
