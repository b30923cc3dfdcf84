"""train_moco: MoCo v2 on the configured split (public by default)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.moco.train import train_moco
from dpsad.jobs.stage import run_stage
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    out = snakemake.output
    train_moco(read_datafile(snakemake.input.data), snakemake.params.settings, job_device(snakemake),
               out.encoder, out.ledger, out.losses, log)


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
