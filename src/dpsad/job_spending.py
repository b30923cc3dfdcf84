"""A DP stage's books: what a Snakemake job that wrote a ledger records of its use of the private records.

The one place that reads a Snakemake job's objects to keep the books, so that the privacy package reads none.
"""

from __future__ import annotations

from pathlib import Path

from .privacy.books.ledger import read_ledgers
from .privacy.books.spent_log import record_spending


def record_stage_spending(snakemake, log) -> None:
    """A stage's books (``dpsad.jobs.stage.run_stage(..., books=record_stage_spending)``): append the private
    entries of its ledger output to results/<dataset>/spent.jsonl."""
    ledger = getattr(snakemake.output, "ledger", None)
    dataset = getattr(getattr(snakemake, "wildcards", None), "dataset", None)
    if not ledger or not dataset or not Path(ledger).is_file():
        return
    added = record_spending(Path("results") / dataset, read_ledgers([ledger]), source=f"{snakemake.rule}: {ledger}")
    if added:
        log.info("recorded %d use(s) of the private records in results/%s/spent.jsonl", added, dataset)
