"""inception_figures: FID, IS and KID in Inception-v3's space of a dataset's real row and every run."""
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.inception import row_figures
from dpsad.files.atomic import write_json
from dpsad.jobs.stage import run_stage
from dpsad.synthetic import load_synthetic


def main(snakemake, log):
    data = read_datafile(snakemake.input.data)
    runs = snakemake.params.runs
    synthetic = {run: load_synthetic(path).images for run, path in zip(runs, snakemake.input.synthetic)}
    figures = row_figures(data.splits["test"].images, data.splits["train"].images, synthetic, snakemake.params.settings)
    for row, found in figures.items():
        log.info("%s: %s", row, found)
    write_json(snakemake.output[0], figures)


run_stage(snakemake, main)  # noqa: F821
