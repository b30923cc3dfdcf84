"""PE's outputs stamped with the preparation of ``data.h5`` their votes read, after the loop wrote them.

PE's loops (``evolution.py``, ``simulator_evolution.py``) are under their own mechanism digest
(:data:`dpsad.privacy.mechanism.code_digest.PE_MODULES`): a change there reruns every PE run, and a released one then
stops at its release folder.  So the stamp the other stages put in their entries when they make them
(:func:`dpsad.privacy.books.preparation.stamped`) is put into PE's entry here, once the loop returns, in both places
it was written: the population file's ``ledger`` and the ledger file, which are checked against each other.
"""

from __future__ import annotations

from ..files.artifacts import load_torch, save_torch
from ..privacy.books.ledger import write_ledger
from ..privacy.books.preparation import stamped


def stamp_written_population(entry: dict, attrs, *, out_path, ledger_path, upstream_ledgers=()) -> dict:
    """``entry`` (the loop's own, returned) stamped with the preparation of ``attrs``, and written again into the
    population file ``out_path`` and the ledger ``ledger_path`` (composed with ``upstream_ledgers`` as the loop
    composed it).  Returns the entry."""
    stamped([entry], attrs)
    population = load_torch(out_path)
    population["ledger"] = [entry]
    save_torch(population, out_path)
    write_ledger(ledger_path, [entry], upstream=upstream_ledgers)
    return entry
