"""evaluate: fidelity, downstream utility and the memorisation audit of one synthetic dataset."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.files.artifacts import read_json
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.evaluate_stage import evaluate_synthetic, load_evaluator, read_clusters_as_classes, write_metrics
from dpsad.synthetic import load_synthetic
from dpsad.jobs.stage import optional_input, run_stage


def main(snakemake, log):
    data = read_datafile(snakemake.input.data)
    synthetic = load_synthetic(snakemake.input.synthetic)
    pseudo = optional_input(snakemake.input.labels)
    mapping = None
    if pseudo:  # a k-means run: its cluster ids are read as the public split's majority class of each cluster
        synthetic, mapping = read_clusters_as_classes(synthetic, data, pseudo)
    metrics = evaluate_synthetic(
        synthetic, data, load_evaluator(snakemake.input.evaluator), snakemake.params.settings,
        read_json(snakemake.input.privacy, "privacy verdict"), log,
    )
    metrics["label_source"] = "true" if snakemake.params.labels is True else str(snakemake.params.labels)
    if mapping is not None:
        metrics["cluster_to_class"] = mapping
    write_metrics(snakemake.output[0], metrics)


run_stage(snakemake, main)  # noqa: F821
