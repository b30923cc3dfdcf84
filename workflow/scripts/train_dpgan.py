"""train_dpgan: the dp-GAN baseline (WGAN-GP, DP-SGD critic with grouped, adaptive clipping, warm start)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.gan.train import train_dpgan
from dpsad.plots import loss_curve
from dpsad.jobs.stage import optional_input, run_stage, stage_settings
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    out, p = snakemake.output, snakemake.params
    settings = stage_settings(snakemake)
    train_dpgan(
        data=read_datafile(snakemake.input.data, splits=("train", "public")), settings=settings, labels_mode=p.labels,
        device=job_device(snakemake), out_path=out.model,
        loss_csv=out.losses, ledger_path=out.ledger, upstream_ledgers=list(snakemake.input.upstream_ledgers), log=log,
        pseudo_labels=optional_input(snakemake.input.labels),
    )
    loss_curve(out.losses, out.plot, f"dp-GAN {snakemake.wildcards.run} ({snakemake.wildcards.dataset})")


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
