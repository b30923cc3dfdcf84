"""A DP stage's books: what a Snakemake job that wrote a ledger records of its use of the private records.

The one place that reads a Snakemake job's objects to keep the books, so that the privacy package reads none.
"""

from __future__ import annotations

from pathlib import Path

from .privacy.books.integrity import check_checkpoint_entries
from .privacy.books.ledger import read_ledgers
from .privacy.books.spent_log import record_spending


def check_upstream_checkpoints(snakemake) -> None:
    """Before a stage that writes a ledger reads a record: refuse a checkpoint it builds on (a teacher, a warm
    start, Private Evolution's generator) whose embedded ledger entries are not in the upstream ledgers the job
    composes (``input.upstream_ledgers``).  Prevents a checkpoint copied over another's file from being composed
    with the other's ledger, its own spending unstated: the release's check sees only the run's own generator,
    whose ledger would carry the wrong entries along.  Checkpoints written before they embedded their entries are
    left to their ledgers, and so are the ``.h5`` artifacts (features, k-means labels, central images), which
    embed none."""
    from .training.checkpoints import load_checkpoint

    upstream = [str(path) for path in getattr(snakemake.input, "upstream_ledgers", None) or []]
    checkpoints = [str(path) for path in snakemake.input if str(path).endswith(".pt")]
    if not upstream or not checkpoints:
        return
    entries = read_ledgers(upstream)
    for path in checkpoints:
        checkpoint = load_checkpoint(path)
        if isinstance(checkpoint.get("ledger"), list):
            check_checkpoint_entries(checkpoint, path, entries, " + ".join(upstream),
                                     remedy=f"delete {path} and rerun the rule that writes it")


class StageBooks:
    """A DP stage's books (``dpsad.jobs.stage.run_stage(..., books=record_stage_spending)``): ``before`` the body
    reads a record, :func:`check_upstream_checkpoints`; once the outputs are written, the private entries of the
    ledger output appended to results/<dataset>/spent.jsonl."""

    def before(self, snakemake, log) -> None:
        check_upstream_checkpoints(snakemake)

    def __call__(self, snakemake, log) -> None:
        ledger = getattr(snakemake.output, "ledger", None)
        dataset = getattr(getattr(snakemake, "wildcards", None), "dataset", None)
        if not ledger or not dataset or not Path(ledger).is_file():
            return
        added = record_spending(Path("results") / dataset, read_ledgers([ledger]), source=f"{snakemake.rule}: {ledger}")
        if added:
            log.info("recorded %d use(s) of the private records in results/%s/spent.jsonl", added, dataset)


record_stage_spending = StageBooks()
