"""train_pe: Private Evolution from the run's generator (its teacher, or its own DPDM training: a DP generator's
spending is composed upstream): noisy vote histograms; PE itself trains nothing on the private records."""
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.jobs.stage import optional_input, run_stage, stage_settings
from dpsad.pe import private_evolution
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    out, p = snakemake.output, snakemake.params
    # a plain dict: the population file stores it, and loads without dpsad's settings classes
    settings = stage_settings(snakemake).as_dict()
    private_evolution(
        data=read_datafile(snakemake.input.data, splits=("train",)), settings=settings,
        labels_mode=p.labels, teacher_path=snakemake.input.teacher, device=job_device(snakemake),
        out_path=out.model, ledger_path=out.ledger, votes_csv=out.votes,
        upstream_ledgers=list(snakemake.input.upstream_ledgers), log=log,
        pseudo_labels=optional_input(snakemake.input.labels),
    )


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
