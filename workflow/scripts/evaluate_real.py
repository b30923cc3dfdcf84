"""evaluate_real: the reference row, classifiers trained on the real private split."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.evaluate_stage import evaluate_real, load_evaluator, write_metrics
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    metrics = evaluate_real(read_datafile(snakemake.input.data), load_evaluator(snakemake.input.evaluator),
                            snakemake.params.settings, log)
    write_metrics(snakemake.output[0], metrics)


run_stage(snakemake, main)  # noqa: F821
