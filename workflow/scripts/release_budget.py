"""release_budget: compose every release of a dataset into release/{dataset}/BUDGET.json, or refuse past the budget."""
from pathlib import Path

from dpsad.artifacts import read_json
from dpsad.atomic import readable_per_umask, write_json
from dpsad.data.datafile import read_attrs
from dpsad.privacy.budget import RELEASED_LOG, compose_releases
from dpsad.privacy.spending import logged_rows
from dpsad.stage import run_stage


def main(snakemake, log):
    p = snakemake.params
    listed = [(run, read_json(path, "privacy verdict")) for run, path in zip(p.runs, snakemake.input.privacy)]
    # Every release built before has left, whether or not the list still names it (or names a rerun of it).
    rows = logged_rows(Path(snakemake.output.budget).parent / RELEASED_LOG)
    n = int(read_attrs(snakemake.input.data)["n_train"])
    result = compose_releases(snakemake.wildcards.dataset, listed, budget=p.budget, num_private_records=n,
                              already_released=[row["entry"] for row in rows])
    result["released_before"] = sorted({row["source"] for row in rows})
    write_json(snakemake.output.budget, result)
    readable_per_umask(snakemake.output.budget)
    log.info("%s: released total epsilon %.4f at delta %g (budget %s) over %s", snakemake.wildcards.dataset,
             result["epsilon"], result["delta"], p.budget, [r["run"] for r in result["runs"]])


run_stage(snakemake, main)  # noqa: F821
