"""train_teacher: a diffusion model on the split the config names (teacher or non-private reference)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import launch_training
from dpsad.plots import loss_curve
from dpsad.jobs.stage import optional_input, run_stage, stage_settings
from dpsad.job_spending import record_stage_spending
from dpsad.pe.population import population_data
from dpsad.training.teacher import train_teacher


def main(snakemake, log):
    out = snakemake.output
    settings = stage_settings(snakemake)
    if settings.split == "central":  # the warm-up's central images, a DP release (their ledger is upstream)
        data = read_datafile(optional_input(snakemake.input.central), splits=("central",))
    elif settings.split == "population":  # a PE run's population, a DP release (its ledger is upstream)
        metadata = read_datafile(snakemake.input.data, splits=())
        data = population_data(optional_input(snakemake.input.population), metadata, snakemake.params.labels)
    else:
        reads_public = settings.privacy == "dp" and (settings.dp.clip_from_public or settings.dp.subspace)
        data = read_datafile(snakemake.input.data, splits=(settings.split, "public") if reads_public else (settings.split,))

    def train(context, device):
        train_teacher(
            data=data, settings=settings, diffusion_settings=snakemake.params.diffusion, labels_mode=snakemake.params.labels,
            device=device, out_path=out.model, loss_csv=out.losses, ledger_path=out.ledger,
            stage_name=f"train_teacher[{snakemake.wildcards.teacher}]", log=log,
            pseudo_labels=optional_input(snakemake.input.labels), distributed=context,
            init_path=optional_input(snakemake.input.init), upstream_ledgers=list(snakemake.input.upstream_ledgers),
        )

    launch_training(snakemake, train)
    loss_curve(out.losses, out.plot, f"teacher '{snakemake.wildcards.teacher}' ({snakemake.wildcards.dataset})")


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
