"""A DP stage's books: what a Snakemake job that wrote a ledger records of its use of the private records.

The one place that reads a Snakemake job's objects to keep the books, so that the privacy package reads none.
"""

from __future__ import annotations

from pathlib import Path

from .errors import DpsadError
from .privacy.books.integrity import check_checkpoint_entries
from .privacy.books.ledger import read_ledgers
from .privacy.books.spent_log import record_spending


def embedded_entries(path) -> list[dict] | None:
    """The ledger entries an artifact embeds (a training checkpoint's ``ledger``; the ``ledger`` attribute, JSON, of
    the features, k-means labels and central images), or None where it embeds none (the prepared data, files
    written before artifacts embedded them)."""
    import json

    import h5py

    from .training.checkpoints import load_checkpoint

    if str(path).endswith(".pt"):
        entries = load_checkpoint(path).get("ledger")
    else:
        try:
            with h5py.File(path, "r") as handle:
                raw = handle.attrs.get("ledger")
        except OSError:  # not an HDF5 file (truncated, foreign): the stage's own reader says so in one line
            return None
        try:
            entries = json.loads(raw) if raw is not None else None
        except (TypeError, ValueError) as err:
            raise DpsadError(f"{path}: its ledger attribute is damaged ({err}), expected the JSON list of entries its "
                             "writer stored: delete it and rerun the rule that writes it") from err
    return entries if isinstance(entries, list) else None


def check_upstream_artifacts(snakemake) -> None:
    """Before a stage that writes a ledger reads a record: refuse an artifact it builds on (a teacher, a warm
    start, Private Evolution's generator, MoCo's encoder, features or k-means labels, the central images) whose
    embedded ledger entries are not in the upstream ledgers the job composes (``input.upstream_ledgers``).
    Prevents a file copied over another's from being composed with the other's ledger, its own spending unstated:
    the release's check sees only the run's own generator, whose ledger would carry the wrong entries along."""
    upstream = [str(path) for path in getattr(snakemake.input, "upstream_ledgers", None) or []]
    artifacts = [str(path) for path in snakemake.input if str(path).endswith((".pt", ".h5"))]
    if not upstream or not artifacts:
        return
    entries = read_ledgers(upstream)
    for path in artifacts:
        embedded = embedded_entries(path)
        if embedded is not None:
            check_checkpoint_entries({"ledger": embedded}, path, entries, " + ".join(upstream),
                                     remedy=f"delete {path} and rerun the rule that writes it")


class StageBooks:
    """A DP stage's books (``dpsad.jobs.stage.run_stage(..., books=record_stage_spending)``): ``before`` the body
    reads a record, :func:`check_upstream_artifacts`; once the outputs are written, the private entries of the
    ledger output appended to results/<dataset>/spent.jsonl."""

    def before(self, snakemake, log) -> None:
        check_upstream_artifacts(snakemake)

    def __call__(self, snakemake, log) -> None:
        ledger = getattr(snakemake.output, "ledger", None)
        dataset = getattr(getattr(snakemake, "wildcards", None), "dataset", None)
        if not ledger or not dataset or not Path(ledger).is_file():
            return
        added = record_spending(Path("results") / dataset, read_ledgers([ledger]), source=f"{snakemake.rule}: {ledger}")
        if added:
            log.info("recorded %d use(s) of the private records in results/%s/spent.jsonl", added, dataset)


record_stage_spending = StageBooks()
