"""sweep_plot: CNN accuracy against epsilon for every method of the sweep target, beside the public row."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.evaluation.sweep import sweep_table, write_sweep
from dpsad.evaluation.table import comparison_rows
from dpsad.plots import utility_against_epsilon
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    table = sweep_table(comparison_rows(list(snakemake.input)))
    write_sweep(table, snakemake.output.csv)
    utility_against_epsilon(table, snakemake.output.plot, f"{snakemake.wildcards.dataset}: utility against epsilon")
    log.info("sweep: %d points", len(table["points"]))
    if not table["points"]:
        log.warning("sweep: no run states a DP guarantee, so the plot has no points (privacy.json of each run says "
                    "why; a declared earlier use of unknown cost, as the demo's, makes every verdict false)")


run_stage(snakemake, main)  # noqa: F821
