"""release_budget: compose every release of the dataset's private records into release/{dataset}/BUDGET.json and
record the listed runs in the curator's release record, or refuse past the budget."""
from dpsad.files.artifacts import read_json
from dpsad.files.atomic import readable_per_umask
from dpsad.privacy.integrity import check_stated_epsilon
from dpsad.release import WORKSPACE_MARKER, compose_budget
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    p = snakemake.params
    listed = [(run, read_json(path, "privacy verdict")) for run, path in zip(p.runs, snakemake.input.privacy)]
    for (_, privacy), path in zip(listed, snakemake.input.privacy):
        check_stated_epsilon(privacy, path)  # before any of it is written into the curator's record
    result = compose_budget(snakemake.output.budget, dataset=snakemake.wildcards.dataset, data_path=snakemake.input.data,
                            listed=listed, budget=p.budget, curator_dir=p.curator_dir, declared=p.earlier_use,
                            workspace_marker=WORKSPACE_MARKER, new_history=p.new_history)
    readable_per_umask(snakemake.output.budget)
    log.info("%s: released total epsilon %.4f at delta %g (budget %s) over %s; released before: %s",
             snakemake.wildcards.dataset, result["epsilon"], result["delta"], p.budget,
             [r["run"] for r in result["runs"]], result["released_before"])


run_stage(snakemake, main)  # noqa: F821
