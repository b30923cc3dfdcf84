"""cluster_report: the curator's scores of k-means on every feature kind against the private labels (never released)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.moco.cluster import cluster_report
from dpsad.jobs.stage import optional_input, run_stage
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    out = snakemake.output
    cluster_report(read_datafile(snakemake.input.data), snakemake.input.features, snakemake.params.settings, out.report,
                   out.markdown, out.ledger, log, teacher_path=optional_input(snakemake.input.teacher),
                   device=job_device(snakemake), upstream_ledgers=list(snakemake.input.upstream_ledgers))


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
