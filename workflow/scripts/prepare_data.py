"""prepare_data: read the configured source, split it, write data.h5 with the source files' checksum."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from dpsad.data.bundled_uses import BUNDLED_REASON, bundled_digits_held
from dpsad.data.datafile import prepare, split_digest_kinds
from dpsad.data.fingerprint import CACHE_PATH, content_checksum
from dpsad.errors import DpsadError
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    # The files are read where the config says they are now (root/path are no params: a move reruns nothing).
    section = snakemake.config["data"][snakemake.wildcards.dataset]
    checksum = content_checksum(section, CACHE_PATH)  # files unchanged since planning are not read twice
    if checksum != snakemake.params.source_checksum:
        raise DpsadError(f"data.{snakemake.wildcards.dataset}: the source files changed after the workflow planned this "
                         f"job (checksum {checksum} against {snakemake.params.source_checksum}), expected them unchanged "
                         "while it runs: start the workflow again")
    # From the config, not params: a changed delta must not rerun this rule, only be checked against n here.
    deltas = {run["name"]: float(run["delta"]) for run in snakemake.config["runs"]
              if run["method"] not in ("nonprivate", "public")}
    splits = prepare(section, snakemake.wildcards.dataset, snakemake.output[0],
                     deltas=deltas, source_checksum=checksum)
    log.info("wrote %s: %s (source checksum %s)", snakemake.output[0], {name: len(split) for name, split in splits.items()},
             checksum)
    try:  # a warning before any training: account, the budget and the release decide (and stop on this error)
        if held := bundled_digits_held(split_digest_kinds(snakemake.output[0], "private"), section.get("earlier_use")):
            log.warning("no run of %s will state a DP guarantee: %d of its private records are bundled digits; %s "
                        "(data.%s.without_bundled_digits: true leaves them out of the private split)",
                        snakemake.wildcards.dataset, held, BUNDLED_REASON, snakemake.wildcards.dataset)
    except DpsadError as err:
        log.warning("whether %s's private records hold bundled MNIST-5k digits is not known: %s",
                    snakemake.wildcards.dataset, err)


run_stage(snakemake, main)  # noqa: F821
