"""release_budget: compose every release of the dataset's private records into release/{dataset}/BUDGET.json and
record the listed runs in the curator's record, or refuse past the budget."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from pathlib import Path

from dpsad.files.artifacts import read_json
from dpsad.files.atomic import readable_per_umask
from dpsad.jobs.stage import run_stage
from dpsad.privacy.books.curator_record import FILE, curator_folder, refuse_other_test_settings
from dpsad.privacy.books.integrity import check_stated_epsilon
from dpsad.release_folder import network_file_system, release_budget


def main(snakemake, log):
    p = snakemake.params
    listed = [(run, read_json(path, "privacy verdict")) for run, path in zip(p.runs, snakemake.input.privacy)]
    for (_, privacy), path in zip(listed, snakemake.input.privacy):
        check_stated_epsilon(privacy, path)  # before any of it is written into the curator's record
        refuse_other_test_settings(privacy.get("test_settings", []), path)
    folder = curator_folder(p.curator_dir)
    if kind := network_file_system(folder):
        log.warning("the curator's record %s is on a %s network file system: SQLite's locks are not to be trusted "
                    "there, and two releases at the same moment could both pass a budget that fits one; keep it on the "
                    "disk of the host that runs Snakemake (docs/running.md)", folder, kind)
    # read from the configuration, not a param: a param would rerun every BUDGET.json built before
    others = []
    if snakemake.input.others:  # the configuration's other datasets that declare an earlier use
        from dpsad.config.inputs import PREPARED_DATA  # only then: it loads the configuration's modules

        declaring = {PREPARED_DATA.format(dataset=name): name for name in snakemake.config["datasets"]}
        others = [(declaring[path], path, snakemake.config["data"][declaring[path]]["earlier_use"])
                  for path in snakemake.input.others]
    record, existed = folder / FILE, (folder / FILE).exists()
    try:
        result = release_budget(snakemake.output.budget, dataset=snakemake.wildcards.dataset,
                                data_path=snakemake.input.data, listed=listed, budget=p.budget,
                                curator_dir=p.curator_dir, declared=p.earlier_use, workspace=Path.cwd(),
                                check_path=snakemake.output.check, other_declarations=others)
    except Exception:
        if not existed and record.exists():  # e.g. a declared use of unknown cost, kept before the refusal
            log.warning("created the curator's record %s before the refusal below; every later release of any "
                        "workspace composes with what it keeps", record)
        raise
    readable_per_umask(snakemake.output.budget)
    if result["created"]:
        log.warning("created the curator's record %s: the first release of this user here; every later release of "
                    "any workspace composes with it", result["created"])
    log.info("%s: the releases of its records total epsilon %.4f at delta %g (budget %s) over %s; released before: "
             "%s; the curator's record %s stands at row %d (curator-only: %s)", snakemake.wildcards.dataset,
             result["epsilon"], result["delta"], p.budget, [r["run"] for r in result["runs"]], result["released_before"],
             result["curator_record"]["location"], result["curator_record"]["sequence"], snakemake.output.check)


run_stage(snakemake, main)  # noqa: F821
