"""evaluate: fidelity, downstream utility and the memorisation audit of one synthetic dataset."""
import json

from dpsad.data.datafile import read_datafile
from dpsad.evaluation.report import evaluate_synthetic, load_evaluator, write_metrics
from dpsad.io import load_synthetic
from dpsad.stage import run_stage


def main(snakemake, log):
    metrics = evaluate_synthetic(
        load_synthetic(snakemake.input.synthetic), read_datafile(snakemake.input.data), load_evaluator(snakemake.input.evaluator),
        snakemake.params.settings, json.loads(open(snakemake.input.privacy).read()), log,
    )
    write_metrics(snakemake.output[0], metrics)


run_stage(snakemake, main)  # noqa: F821
