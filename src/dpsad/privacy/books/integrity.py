"""Cross-checks before anything is released: the stated verdict, its ledger and the checkpoint agree.

Tampering by the curator is outside the threat model; a damaged or hand-edited
ledger or ``privacy.json`` is not, because it would be stamped into a release
as if true.  Three checks, each a one-line refusal naming the file:

- :func:`check_stated_epsilon`: ``privacy.json``'s epsilon is what its own
  components compose to, and a stated guarantee has no component that voids
  it (``release_budget`` composes the stated figures; a wrong one there
  would be written into the curator's record).
- :func:`check_components_match_ledger`: ``privacy.json`` lists exactly the
  entries of the generator's ledger.
- :func:`check_checkpoint_entries`: every entry the training embedded in its
  checkpoint is in the ledger, field for field (a ledger replaced by another
  run's, or with entries removed).

Each ledger file also checks its own ``entries_sha256`` when read
(:func:`dpsad.privacy.books.ledger.read_ledgers`).
"""

from __future__ import annotations

import math

from ...errors import DpsadError
from ...files.artifacts import read_json
from ..accounting import cached_accountant
from .ledger import components_of, read_ledgers, verdict

EPSILON_TOLERANCE = 1e-6  # relative: the accountant is deterministic, a recomputation gives the same figure


def check_stated_epsilon(privacy: dict, path) -> None:
    """Refuse a ``privacy.json`` whose epsilon or guarantee its own components do not give."""
    try:
        components = privacy["components"]
        stated, guarantee = privacy["epsilon"], privacy["dp_guarantee"]
        delta, accountant = float(privacy["delta"]), str(privacy["accountant"])
        n = int(privacy["num_private_records"])
    except (KeyError, TypeError, ValueError) as err:
        raise DpsadError(f"{path}: not a privacy verdict written by the account stage ({err}), expected its keys "
                         "components, epsilon, dp_guarantee, delta, accountant, num_private_records") from None
    if not guarantee:
        return  # a false verdict claims nothing: it is never released
    recomputed = verdict(components, delta=delta, accountant=accountant, target_epsilon=None, num_private_records=n)
    if not recomputed["dp_guarantee"]:
        raise DpsadError(f"{path}: states dp_guarantee true, but its components give none ({recomputed['reasons'][0]}), "
                         "expected the verdict the account stage wrote: rerun account")
    epsilon = cached_accountant(accountant).epsilon(components_of(components), delta)
    if not isinstance(stated, (int, float)) or not math.isclose(stated, epsilon, rel_tol=EPSILON_TOLERANCE, abs_tol=1e-12):
        raise DpsadError(f"{path}: states epsilon {stated!r}, but its components compose to {epsilon:.6g} at delta "
                         f"{delta:g}, expected the verdict the account stage wrote: rerun account")


def check_components_match_ledger(privacy: dict, privacy_path, ledger_entries: list[dict], ledger_path) -> None:
    """Refuse a ``privacy.json`` whose components are not the generator's ledger entries."""
    if privacy.get("components") != ledger_entries:
        raise DpsadError(f"{privacy_path}: its components differ from the entries of {ledger_path}, expected the "
                         "verdict composed from that ledger: rerun account")


def check_checkpoint_entries(checkpoint: dict, checkpoint_path, ledger_entries: list[dict], ledger_path,
                             remedy: str = "rerun that stage") -> None:
    """Refuse a ledger that lacks, or differs in, an entry the training embedded in its checkpoint; ``remedy``
    ends the message (a released generator's ledger: rerun its stage)."""
    embedded = checkpoint.get("ledger")
    if not isinstance(embedded, list):
        raise DpsadError(f"{checkpoint_path}: holds no ledger entries, expected a checkpoint written by a dpsad "
                         "training stage")
    by_uid = {entry.get("uid"): entry for entry in ledger_entries}
    for entry in embedded:
        found = by_uid.get(entry.get("uid"))
        if found != entry:
            what = "lacks" if found is None else "has another version of"
            raise DpsadError(f"{ledger_path}: {what} the entry for '{entry.get('stage')}' that {checkpoint_path} "
                             f"was built with, expected the ledger written with it: {remedy}")


def verified_verdict(privacy_path, ledger_path) -> dict:
    """``privacy.json`` read back, refused unless it lists exactly the ledger's entries and states what they
    compose to: the verdict a stage may stamp into data (never an editable file's word alone)."""
    privacy = read_json(privacy_path, "privacy verdict")
    check_components_match_ledger(privacy, privacy_path, read_ledgers([ledger_path]), ledger_path)
    check_stated_epsilon(privacy, privacy_path)
    return privacy
