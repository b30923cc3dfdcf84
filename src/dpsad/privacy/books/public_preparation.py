"""Which preparation of ``data.h5`` a training on its public split read: the ``public_records`` of a ledger entry.

Failure prevented: a training on the public split (the public teacher, MoCo, k-means fitted on public features)
kept by ``snakemake --touch`` after ``data.h5`` was prepared again with other splits (another ``seed`` or
``public_fraction``, records added), so that a DP student distils from a teacher that read, without noise,
records now in the private split, or a public run's images come from it, under a statement that covers those
records.  :mod:`.preparation` ties the uses of the private split to their preparation; this ties the uses of the
public split, with the same ``records_id`` (drawn at each preparation, for both splits).  The verdict (``account``),
the budget and the release (:func:`dpsad.release_folder.check_runs_read_these_records`) refuse another preparation's.

An entry written before 0.3.1 has no ``public_records`` and passes: what its training read is not known, as for
the uses of a ``data.h5`` from before 0.2.9.  A preparation's id says nothing of the records (it is random).
Two entries of one uid that differ in this key stop the job that reads them (``ledger.unique_entries``), as two
that differ in ``records`` do.
"""

from __future__ import annotations

from .preparation import records_id_of

PUBLIC_RECORDS = "public_records"  # the ledger entry's key


def stamped_public(entries: list[dict], attrs) -> list[dict]:
    """``entries`` with each entry that is not a use of the private split naming the preparation of ``attrs`` (in
    place; returned).  Called where a stage that read the public split of that ``data.h5`` makes its entries,
    before they are written anywhere."""
    records = records_id_of(attrs)
    for entry in entries:
        if not entry["private"]:
            entry[PUBLIC_RECORDS] = records
    return entries


def public_records_problem(entries: list[dict], attrs, data_name: str = "data.h5") -> str | None:
    """Why a use of the public split in ``entries`` read another preparation than ``attrs``' (``data_name``'s), or
    None."""
    expected = records_id_of(attrs)
    for entry in entries:
        if PUBLIC_RECORDS in entry and entry[PUBLIC_RECORDS] != expected:
            return (f"{entry['stage']} trained without noise on another preparation of {data_name} (its public split, "
                    "or images made from it; prepared again after that stage ran, its output kept, e.g. by --touch), "
                    "so it may have read records now in the private split, expected every use to have read "
                    f"{data_name}'s splits: run the stages after prepare_data again (snakemake --forcerun prepare_data)")
    return None
