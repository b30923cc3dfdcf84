"""inception_figures: FID, IS and KID in Inception-v3's space of a dataset's real row and every run."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.evaluate_stage import check_compatible
from dpsad.evaluation.inception import row_figures
from dpsad.files.atomic import write_json
from dpsad.jobs.stage import run_stage
from dpsad.runtime.devices import job_device
from dpsad.synthetic import load_synthetic


def main(snakemake, log):
    cuda = job_device(snakemake).type == "cuda"  # a GPU job on a node without CUDA stops here, not at its time limit
    data = read_datafile(snakemake.input.data)
    synthetic = {}
    for run, path in zip(snakemake.params.runs, snakemake.input.synthetic):
        check_compatible(loaded := load_synthetic(path), data, classes=False)  # the figures read no label
        synthetic[run] = loaded.images
    figures = row_figures(data.splits["test"].images, data.splits["train"].images, synthetic, snakemake.params.settings,
                          cuda=cuda)
    for row, found in figures.items():
        log.info("%s: %s", row, found)
    write_json(snakemake.output[0], figures)


run_stage(snakemake, main)  # noqa: F821
