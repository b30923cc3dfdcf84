"""extract_features: MoCo backbone features for every split."""
from dpsad.data.datafile import read_datafile
from dpsad.moco.train import extract_features
from dpsad.stage import run_stage
from dpsad.utils import resolve_device


def main(snakemake, log):
    extract_features(read_datafile(snakemake.input.data), snakemake.input.encoder, resolve_device(snakemake.params.device),
                     snakemake.output[0])


run_stage(snakemake, main)  # noqa: F821
