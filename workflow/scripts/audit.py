"""audit_run: canaries in one training run of a run's method and settings; an empirical lower bound on epsilon."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from pathlib import Path

import numpy as np

from dpsad.files.atomic import write_json
from dpsad.audit.pipeline import audit_run
from dpsad.data.datafile import read_datafile
from dpsad.runtime.devices import job_device
from dpsad.plots import audit_histogram
from dpsad.privacy.books.spent_log import record_spending
from dpsad.job_spending import check_upstream_artifacts
from dpsad.jobs.stage import optional_input, run_stage, stage_settings


def main(snakemake, log):
    p, out = snakemake.params, snakemake.output
    run = p.run
    settings = stage_settings(snakemake)
    check_upstream_artifacts(snakemake)  # its accounted epsilon and spending composes the teacher's ledger
    inputs = {"teacher": optional_input(snakemake.input.teacher),
              "upstream_ledgers": list(snakemake.input.upstream_ledgers)}
    result = audit_run(method=run["method"], data=read_datafile(snakemake.input.data, splits=("train", "public")),
                       run=run, settings=settings, inputs=inputs, params={"labels": p.labels, "diffusion": p.diffusion},
                       audit=p.audit, device=job_device(snakemake), work_parent=str(Path(snakemake.output.audit).parent),
                       log=log)
    scores, included = np.array(result["scores"]), np.array(result["included"], dtype=bool)
    audit_histogram(scores, included, out.plot,
                    f"{run['name']}: eps_LB {result['eps_lower_bound']:.3g}, accounted {result['accounted_epsilon']}")
    write_json(out.audit, result)
    # a second training run on the private records: curator-side spending, never part of a release
    record_spending(Path("results") / snakemake.wildcards.dataset, result["components"],
                    source=f"audit_run: {out.audit}")
    log.info("audit %s: eps_lower_bound %.4f, accounted epsilon %s, mechanism audit %s", run["name"],
             result["eps_lower_bound"], result["accounted_epsilon"], result.get("mechanism_audit", {}).get("eps_lower_bound"))


run_stage(snakemake, main)  # noqa: F821
