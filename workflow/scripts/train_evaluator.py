"""train_evaluator: the classifier that scores synthetic data (trained on private records; never released)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.evaluate_stage import train_evaluator
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    train_evaluator(read_datafile(snakemake.input.data), snakemake.params.settings, snakemake.output[0], log)


run_stage(snakemake, main)  # noqa: F821
