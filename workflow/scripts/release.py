"""release: copy what a run may share into release/{dataset}/{run}/ (nothing when it has no guarantee)."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from pathlib import Path

from dpsad.config.inputs import PREPARED_DATA, RELEASE_CHECK
from dpsad.release_folder import build_release
from dpsad.jobs.stage import run_stage
from dpsad.training.checkpoints import load_checkpoint


def main(snakemake, log):
    dataset = snakemake.wildcards.dataset
    files = build_release(snakemake.output[0], synthetic_path=snakemake.input.synthetic,
                          privacy_path=snakemake.input.privacy, checkpoint=load_checkpoint(snakemake.input.generator),
                          checkpoint_path=snakemake.input.generator, ledger_path=snakemake.input.ledger,
                          include_generator=snakemake.params.include_generator, budget_path=snakemake.input.budget,
                          # the configuration's, not a param: a new param would rerun every release built before
                          configured_budget=snakemake.config["data"][dataset]["privacy_budget"],
                          configured_use=snakemake.config["data"][snakemake.wildcards.dataset].get("earlier_use"),
                          configured_uses={name: snakemake.config["data"][name].get("earlier_use")
                                           for name in snakemake.config["datasets"]},
                          # read, not an input: a new input would rerun every release folder built before
                          dataset=dataset, data_path=PREPARED_DATA.format(dataset=dataset),
                          curator_dir=snakemake.config["curator_dir"], workspace=Path.cwd(),
                          check_path=RELEASE_CHECK.format(dataset=dataset))
    log.info("release %s: %s", snakemake.output[0], ", ".join(files))
    if "NOT_RELEASED.txt" in files:
        log.warning("%s has no DP guarantee: only privacy.json and NOT_RELEASED.txt were released", snakemake.wildcards.run)


run_stage(snakemake, main)  # noqa: F821
