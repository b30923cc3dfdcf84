"""extract_features: MoCo features (projection head or encoder) for every split."""
from dpsad.data.datafile import read_datafile
from dpsad.moco.train import extract_features
from dpsad.stage import job_device, run_stage


def main(snakemake, log):
    extract_features(read_datafile(snakemake.input.data), snakemake.input.encoder, job_device(snakemake),
                     snakemake.output[0], which=snakemake.params.which)


run_stage(snakemake, main)  # noqa: F821
