"""One privacy budget over everything released from a dataset's private records.

Each run's ``privacy.json`` states the guarantee of that release alone.  A
recipient of several releases of the same private records gets their
composition, so a dataset has one budget: :func:`compose_releases` composes
the released runs' ledger entries (each use of the private records once, by
``uid``: a DP teacher shared by two runs counts once) at the budget's delta,
and refuses, naming the run, the release that would pass the budget.

Assumptions: every released run was trained on the same private records
(add/remove adjacency of one record, the dataset's ``n``); runs drew their
Poisson batches and noise independently (their mechanisms compose
adaptively); a run without a guarantee releases nothing derived from the
private records and adds nothing here.
"""

from __future__ import annotations

from ..errors import PrivacyError
from .accounting import compose_epsilon
from .ledger import components_of, unique_entries

RELEASED_LOG = "released.jsonl"  # beside BUDGET.json: the entries of every release ever built, append-only
SCOPE_ALONE = ("epsilon covers this release alone; every release of this dataset's private records together is "
               "stated in ../BUDGET.json")


def compose_releases(dataset: str, released: list[tuple[str, dict]], *, budget: dict,
                     num_private_records: int, already_released: list[dict] = ()) -> dict:
    """BUDGET.json of ``dataset``: the composition of ``released`` [(run name, privacy.json dict)], in order.

    ``already_released``: the entries of every release made before (a
    re-release after a rerun counts both versions: the first was shared).
    ``budget``: ``{epsilon, delta, accountant}``.  Raises PrivacyError (one
    line, naming the run, the budget and the total) as soon as a run would
    bring the total past ``budget['epsilon']``.
    """
    epsilon_cap, delta, accountant = float(budget["epsilon"]), float(budget["delta"]), budget.get("accountant", "pld")
    if num_private_records > 0 and delta >= 1.0 / num_private_records:
        raise PrivacyError(f"data.{dataset}.privacy_budget.delta = {delta:g} is not below 1/n = "
                           f"{1.0 / num_private_records:.3g}, expected a smaller delta")
    entries = unique_entries(already_released)
    total = compose_epsilon(components_of(entries), delta, accountant) if entries else 0.0
    rows = [{"run": "(released before)", "released": True, "epsilon_total_after": total}] if entries else []
    if total > epsilon_cap * (1 + 1e-9):
        raise PrivacyError(f"the releases already made from {dataset} total epsilon {total:.4g} at delta {delta:g}, over "
                           f"data.{dataset}.privacy_budget epsilon {epsilon_cap:g}; nothing more can be released")
    for name, privacy in released:
        if not privacy.get("dp_guarantee"):
            rows.append({"run": name, "released": False, "epsilon_alone": None,
                         "note": "no DP guarantee: only privacy.json and NOT_RELEASED.txt leave results/"})
            continue
        entries = unique_entries(entries + list(privacy["components"]))
        total = compose_epsilon(components_of(entries), delta, accountant)
        if total > epsilon_cap * (1 + 1e-9):
            raise PrivacyError(f"releasing run '{name}' would bring the total over {dataset}'s releases to epsilon "
                               f"{total:.4g} at delta {delta:g}, over data.{dataset}.privacy_budget epsilon "
                               f"{epsilon_cap:g}; remove it from data.{dataset}.release or raise the budget")
        rows.append({"run": name, "released": True, "epsilon_alone": privacy.get("epsilon"),
                     "delta_alone": privacy.get("delta"), "epsilon_total_after": total})
    return {
        "dataset": dataset,
        "budget": {"epsilon": epsilon_cap, "delta": delta, "accountant": accountant},
        "epsilon": total,
        "delta": delta,
        "accountant": accountant,
        "num_private_records": num_private_records,
        "runs": rows,
        "components": entries,
        "statement": (f"Every release of {dataset} in this folder together is ({total:.4g}, {delta:g})-DP with respect "
                      f"to its private training split ({accountant} accounting over the union of their ledgers). "
                      "Stages run by the curator on the private split but not released (sweeps, audits, reruns) "
                      "are not part of this total: see results/<dataset>/spent.json."),
    }
