"""privacy_spent: results/{dataset}/spent.json, the composition of every recorded use of the private records."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from pathlib import Path

from dpsad.privacy.books.spent_log import write_spent_summary
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    summary = write_spent_summary(Path(snakemake.output[0]).parent, delta=snakemake.params.delta)
    log.info("spent on %s: epsilon %s over %d DP uses; without a guarantee: %s", snakemake.wildcards.dataset,
             summary["epsilon_of_dp_uses"], summary["dp_uses"], summary["uses_without_a_guarantee"])


run_stage(snakemake, main)  # noqa: F821
