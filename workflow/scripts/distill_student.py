"""distill_student: DP-SAD student and discriminator under DP-SGD (or the flagged paper mode)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import launch_training
from dpsad.plots import loss_curve
from dpsad.jobs.stage import optional_input, run_stage, stage_settings
from dpsad.job_spending import record_stage_spending
from dpsad.training.student import train_student


def main(snakemake, log):
    out = snakemake.output
    settings = stage_settings(snakemake)
    data = read_datafile(snakemake.input.data, splits=("train", "public"))
    def train(context, device):
        train_student(
            data=data, teacher_path=snakemake.input.teacher, upstream_ledgers=list(snakemake.input.upstream_ledgers),
            pseudo_labels=optional_input(snakemake.input.labels),
            settings=settings, labels_mode=snakemake.params.labels, device=device, out_path=out.model, loss_csv=out.losses, ledger_path=out.ledger, log=log, distributed=context,
        )

    launch_training(snakemake, train)
    loss_curve(out.losses, out.plot, f"student {snakemake.wildcards.run} ({snakemake.wildcards.dataset})")


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
