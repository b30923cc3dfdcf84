"""release: copy what a run may share into release/{dataset}/{run}/ (nothing when it has no guarantee)."""
from dpsad.release import build_release
from dpsad.stage import run_stage


def main(snakemake, log):
    checkpoint = None
    if snakemake.params.include_generator:
        from dpsad.training.common import load_checkpoint  # torch (~2 s to load) only when the generator ships

        checkpoint = load_checkpoint(snakemake.input.generator)
    files = build_release(snakemake.output[0], synthetic_path=snakemake.input.synthetic,
                          privacy_path=snakemake.input.privacy, generator_checkpoint=checkpoint,
                          budget_path=snakemake.input.budget)
    log.info("release %s: %s", snakemake.output[0], ", ".join(files))
    if "NOT_RELEASED.txt" in files:
        log.warning("%s has no DP guarantee: only privacy.json and NOT_RELEASED.txt were released", snakemake.wildcards.run)


run_stage(snakemake, main)  # noqa: F821
