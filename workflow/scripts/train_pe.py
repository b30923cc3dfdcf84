"""train_pe: Private Evolution from the run's generator (its teacher, or its own DPDM training: a DP generator's
spending is composed upstream), or from the public font renderer (pe.simulator, Sim-PE): noisy vote histograms;
PE itself trains nothing on the private records."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.jobs.stage import optional_input, run_stage, stage_settings
from dpsad.pe import private_evolution, simulator_evolution
from dpsad.job_spending import record_stage_spending


def main(snakemake, log):
    out, p = snakemake.output, snakemake.params
    # a plain dict: the population file stores it, and loads without dpsad's settings classes
    settings = stage_settings(snakemake).as_dict()
    data = read_datafile(snakemake.input.data, splits=("train",))
    common = dict(data=data, settings=settings, labels_mode=p.labels, device=job_device(snakemake),
                  out_path=out.model, ledger_path=out.ledger, votes_csv=out.votes,
                  upstream_ledgers=list(snakemake.input.upstream_ledgers), log=log)
    if settings.get("simulator"):
        public_source = snakemake.config["data"][snakemake.wildcards.dataset].get("public")
        simulator_evolution(**common, public_source=public_source,
                            teacher_path=optional_input(snakemake.input.get("teacher")))
    else:
        private_evolution(**common, teacher_path=snakemake.input.teacher,
                          pseudo_labels=optional_input(snakemake.input.labels))


run_stage(snakemake, main, books=record_stage_spending)  # noqa: F821
