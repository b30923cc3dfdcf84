"""evaluate: fidelity, downstream utility and the memorisation audit of one synthetic dataset."""
import json

from dpsad.data.datafile import Split, read_datafile
from dpsad.evaluation.report import evaluate_synthetic, load_evaluator, write_metrics
from dpsad.io import load_synthetic
from dpsad.moco.cluster import read_pseudo_labels
from dpsad.stage import optional_input, run_stage


def main(snakemake, log):
    data = read_datafile(snakemake.input.data)
    pseudo = optional_input(snakemake.input.labels)
    if pseudo:  # labels: kmeans -- score against the test split's pseudo-labels
        labels, names = read_pseudo_labels(pseudo)
        data.splits["test"] = Split(data.splits["test"].images, labels["test"])
        data.class_names = names
    metrics = evaluate_synthetic(
        load_synthetic(snakemake.input.synthetic), data, load_evaluator(snakemake.input.evaluator),
        snakemake.params.settings, json.loads(open(snakemake.input.privacy).read()), log,
    )
    write_metrics(snakemake.output[0], metrics)


run_stage(snakemake, main)  # noqa: F821
