"""compare: one table (CSV and Markdown) with a row per dataset and run."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.evaluation.table import comparison_rows, write_comparison
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    rows = comparison_rows(list(snakemake.input.metrics), list(snakemake.input.inception))
    write_comparison(rows, snakemake.output.csv, snakemake.output.md)
    log.info("compared %d rows", len(rows))


run_stage(snakemake, main)  # noqa: F821
