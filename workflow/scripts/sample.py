"""sample: draw the synthetic dataset, stamp it with the run's privacy verdict, write synthetic.h5 and grid.png."""
import json

from dpsad.io import write_synthetic
from dpsad.plots import sample_grid
from dpsad.sampling import load_any_generator
from dpsad.stage import code_version, job_device, run_stage


def main(snakemake, log):
    p = snakemake.params
    device = job_device(snakemake)
    privacy = json.loads(open(snakemake.input.privacy).read())
    draw, class_names = load_any_generator(snakemake.input.generator, device, use_ema=p.settings["use_ema"])
    images, labels = draw(p.settings)
    write_synthetic(
        snakemake.output.synthetic, images, labels, dataset=snakemake.wildcards.dataset, method=p.method,
        run=snakemake.wildcards.run, privacy=privacy, class_names=class_names,
        config_sha256=p.config_sha256, code_version=code_version(),
    )
    sample_grid(images, labels, snakemake.output.grid)
    log.info("wrote %d samples; dp_guarantee=%s", len(images), privacy["dp_guarantee"])


run_stage(snakemake, main)  # noqa: F821
