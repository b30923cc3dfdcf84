"""Which preparation of the private records a use of them read: the ``records`` of a ledger entry.

``prepare_data`` draws ``records_id`` (:func:`new_records_id`) into every ``data.h5`` it writes; each stage that
reads the private split stamps its private ledger entries with it (:func:`stamped`).  A training kept by
``snakemake --touch`` after its data was prepared again then names another preparation, and the verdict
(``account``), the budget (``release_budget``) and the release (``release_run``) refuse it (:func:`records_problem`): it was trained on records that
this ``data.h5``'s statement does not cover, and the curator's record would not count its use of them.  The files
whose row i describes private record i (k-means labels, MoCo features) carry the id too, and their readers refuse
another preparation's (:func:`check_same_preparation`): row i would pair the old record i with the new one.

Privacy: the id is drawn at random, not computed from the records, so it says nothing of them, and it travels with
the entries into released files.  A ``data.h5`` written before 0.2.9 has no id, and the entries of stages run on it
have none: they agree, and what such a use read is not known, as before; every preparation since has one, so an
entry without one never passes against it.
"""

from __future__ import annotations

import uuid

from ...errors import DpsadError

RECORDS_ID = "records_id"  # the data.h5 attribute
RECORDS = "records"  # the ledger entry's key


def new_records_id() -> str:
    """A fresh id for a preparation of the private records (random: it is computed from none of them)."""
    return uuid.uuid4().hex


def records_id_of(attrs) -> str | None:
    """The ``records_id`` of a ``data.h5``'s attributes (or a file that copied them), None before 0.2.9."""
    value = attrs.get(RECORDS_ID)
    return str(value) if value else None


def check_same_preparation(file_attrs, data_attrs, path, data_name: str = "data.h5") -> None:
    """Refuse a per-record file (``path``: k-means labels, features) computed from another preparation of the private
    records than ``data_attrs``' (kept by --touch after data.h5 was prepared again): its row i would pair the old
    record i's label or features with the new record i, a use of the old records no entry names."""
    if records_id_of(file_attrs) != records_id_of(data_attrs):
        raise DpsadError(f"{path}: computed from another preparation of the private records than {data_name} (it was "
                         "prepared again after this file was written, and the file was kept, e.g. by --touch), "
                         "expected one computed from its records: run the stages after prepare_data again (snakemake "
                         "--forcerun prepare_data)")


def stamped(entries: list[dict], attrs) -> list[dict]:
    """``entries`` with each private entry's ``records`` set to the preparation of ``attrs`` (in place; returned).

    Called by every stage that reads the private split of the ``data.h5`` whose attributes are ``attrs``, before its
    entries are written anywhere (ledger, checkpoint, split file)."""
    records = records_id_of(attrs)
    for entry in entries:
        if entry["private"]:
            entry[RECORDS] = records
    return entries


def records_problem(entries: list[dict], attrs, data_name: str = "data.h5") -> str | None:
    """Why the private ``entries`` are not uses of the preparation of ``attrs`` (``data_name``'s), or None."""
    expected = records_id_of(attrs)
    for entry in entries:
        if entry["private"] and entry.get(RECORDS) != expected:
            return (f"{entry['stage']} read another preparation of the private records than {data_name} (it was "
                    "prepared again after that stage ran, and its output was kept, e.g. by --touch), expected every use "
                    f"to have read {data_name}'s records: run the stages after prepare_data again (snakemake "
                    "--forcerun prepare_data)")
    return None
