"""sample: draw the synthetic dataset, stamp it with the run's privacy verdict, write synthetic.h5 and grid.png."""
import json

from dpsad.io import write_synthetic
from dpsad.plots import sample_grid
from dpsad.sampling import generate
from dpsad.stage import code_version, run_stage
from dpsad.training.teacher import load_diffusion_model
from dpsad.utils import resolve_device


def main(snakemake, log):
    p = snakemake.params
    device = resolve_device(p.device)
    model, diffusion, state = load_diffusion_model(snakemake.input.generator, device, use_ema=p.settings["use_ema"])
    privacy = json.loads(open(snakemake.input.privacy).read())
    images, labels = generate(model, diffusion, num_classes=model.config.num_classes, settings=p.settings, device=device)
    write_synthetic(
        snakemake.output.synthetic, images, labels, dataset=snakemake.wildcards.dataset, method=p.method,
        run=snakemake.wildcards.run, privacy=privacy, class_names=state.get("class_names", []),
        config_sha256=p.config_sha256, code_version=code_version(),
    )
    sample_grid(images, labels, snakemake.output.grid)
    log.info("wrote %d samples; dp_guarantee=%s", len(images), privacy["dp_guarantee"])


run_stage(snakemake, main)  # noqa: F821
