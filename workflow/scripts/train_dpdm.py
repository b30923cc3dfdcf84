"""train_dpdm: the DPDM baseline, a diffusion model trained by DP-SGD on the private split (from scratch or warm-started)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import launch_training
from dpsad.plots import loss_curve
from dpsad.jobs.stage import optional_input, run_stage, stage_settings
from dpsad.job_spending import record_stage_spending
from dpsad.training.dpdm import train_dpdm


def main(snakemake, log):
    out = snakemake.output
    settings = stage_settings(snakemake)
    splits = ("train", "public") if settings.dp.clip_from_public or settings.dp.subspace else ("train",)
    data = read_datafile(snakemake.input.data, splits=splits)

    def train(context, device):
        train_dpdm(
            data=data, settings=settings, diffusion_settings=snakemake.params.diffusion, labels_mode=snakemake.params.labels,
            device=device, out_path=out.model, loss_csv=out.losses, ledger_path=out.ledger, stage_name="train_dpdm", log=log,
            pseudo_labels=optional_input(snakemake.input.labels), distributed=context,
            init_path=optional_input(snakemake.input.init), upstream_ledgers=list(snakemake.input.upstream_ledgers),
        )

    launch_training(snakemake, train)
    loss_curve(out.losses, out.plot, f"DPDM {snakemake.wildcards.run} ({snakemake.wildcards.dataset})")


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
