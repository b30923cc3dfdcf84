"""sample: stream the synthetic dataset into synthetic.h5 stamped with the run's privacy verdict; grid.png."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.runtime.devices import job_device
from dpsad.synthetic import write_synthetic_batches
from dpsad.plots import GridCollector
from dpsad.sampling import load_any_generator
from dpsad.jobs.stage import code_version, run_stage
from dpsad.privacy.books.integrity import verified_verdict


def main(snakemake, log):
    p = snakemake.params
    device = job_device(snakemake)
    # The stamp is the ledger's: an edited or stale privacy.json is refused, never written into synthetic.h5.
    privacy = verified_verdict(snakemake.input.privacy, snakemake.input.ledger)
    draw, class_names = load_any_generator(snakemake.input.generator, device, use_ema=p.settings["use_ema"])
    stream = draw(p.settings)
    grid = GridCollector()
    write_synthetic_batches(
        snakemake.output.synthetic, grid.passing(stream), total=stream.total, image_shape=stream.image_shape,
        labelled=stream.labelled, dataset=snakemake.wildcards.dataset, method=p.method,
        run=snakemake.wildcards.run, privacy=privacy, class_names=class_names,
        config_sha256=p.config_sha256, code_version=code_version(),
    )
    grid.save(snakemake.output.grid)
    log.info("wrote %d samples in batches of %d; dp_guarantee=%s", stream.total, p.settings["batch_size"],
             privacy["dp_guarantee"])


run_stage(snakemake, main)  # noqa: F821
