"""extract_features: MoCo features (projection head or encoder) for every split."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.moco.train import extract_features
from dpsad.privacy.books.ledger import read_ledgers, write_ledger
from dpsad.jobs.stage import run_stage
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    out = snakemake.output
    # A per-record map of the encoder: no entry of its own, but the features carry the encoder's ledger.
    entries = read_ledgers(snakemake.input.upstream_ledgers)
    extract_features(read_datafile(snakemake.input.data), snakemake.input.encoder, job_device(snakemake),
                     out.features, which=snakemake.params.which, ledger_entries=entries)
    write_ledger(out.ledger, [], upstream=snakemake.input.upstream_ledgers)


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
