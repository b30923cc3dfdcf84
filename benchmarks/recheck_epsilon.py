"""Recompute every run's stated epsilon independently of dpsad's accounting code.

Reads ``results/<dataset>/<run>/privacy.json`` (the ledger entries the
account stage composed), rebuilds the mechanism from the raw entries with its
own grouping (entries sharing a ``batch`` key are one subsampled Gaussian with
sigma_eff = (sum sigma_i^-2)^-1/2), and composes it with Google's
dp-accounting PLD at a finer grid than dpsad uses, and with Opacus's PRV.
Also prints what the entries would give if shared batches were (wrongly)
composed as independent components.

    .venv/bin/python benchmarks/recheck_epsilon.py [results]
"""

from __future__ import annotations

import json
import sys
import warnings
from collections import defaultdict
from pathlib import Path


def mechanisms(entries: list[dict], joint: bool = True) -> list[tuple[float, float, int]]:
    """(sigma, q, steps) of each independent noisy component."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for i, entry in enumerate(entries):
        if entry["private"] and entry["mechanism"] in ("sgm", "gaussian"):
            key = entry.get("batch") if joint and entry.get("batch") else f"#{i}"
            groups[key].append(entry)
    out = []
    for members in groups.values():
        sigma = sum(float(e["noise_multiplier"]) ** -2 for e in members) ** -0.5
        q = 1.0 if members[0]["mechanism"] == "gaussian" else float(members[0]["sample_rate"])
        out.append((sigma, q, int(members[0]["steps"])))
    return out


def pld(components, delta: float, interval: float = 2e-5) -> float:
    import dp_accounting

    events = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps) for sigma, q, steps in components]
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
    return accountant.compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(delta)


def prv(components, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = list(components)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return accountant.get_epsilon(delta=delta)


def main(root: str = "results") -> None:
    print("| run | target | stated epsilon (accountant) | PLD, independent (grid 2e-5) | Opacus PRV | "
          "if shared batches were independent (PLD) | sigma_eff, q, steps |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(Path(root).glob("*/*/privacy.json")):
        result = json.loads(path.read_text())
        run = f"{path.parent.parent.name}/{path.parent.name}"
        if not result["dp_guarantee"]:
            print(f"| {run} | - | no guarantee | - | - | - | - |")
            continue
        joint = mechanisms(result["components"])
        naive = mechanisms(result["components"], joint=False)
        delta = result["delta"]
        described = "; ".join(f"{s:.4f}, {q:.4g}, {t}" for s, q, t in joint)
        naive_text = f"{pld(naive, delta):.3f}" if naive != joint else "same"
        print(f"| {run} | {result['target_epsilon']} | {result['epsilon']:.4f} ({result['accountant']}) | "
              f"{pld(joint, delta):.4f} | {prv(joint, delta):.4f} | {naive_text} | {described} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
