"""audit_table: results/audit.md, the accounted epsilon of every audit run beside its empirical lower bound."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.audit.report import write_audit_table
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    write_audit_table(list(snakemake.input), snakemake.output.md)
    log.info("audit table of %d runs", len(snakemake.input))


run_stage(snakemake, main)  # noqa: F821
