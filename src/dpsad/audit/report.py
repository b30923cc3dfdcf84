"""results/audit.md: for every audited run, the accounted epsilon beside the empirical lower bound."""

from __future__ import annotations

import json
from pathlib import Path

from ..files.atomic import atomic_path
from ..evaluation.table import format_cell

COLUMNS = ["dataset", "run", "method", "mode", "dp_guarantee", "accounted_epsilon", "claimed_epsilon",
           "eps_lower_bound", "mechanism_eps_lower_bound", "largest_reachable_lower_bound", "canaries", "delta", "verdict"]


def audit_row(path) -> dict:
    a = json.loads(Path(path).read_text())
    mech = a.get("mechanism_audit", {}).get("eps_lower_bound")
    stated = a["accounted_epsilon"] if a["dp_guarantee"] else a.get("claimed_epsilon")
    lower = max(a["eps_lower_bound"], mech or 0.0)
    if stated is None:
        check = "no claim"
    elif lower > stated:
        check = "LOWER BOUND ABOVE THE STATED EPSILON"
    else:
        check = "consistent"
    return {"dataset": Path(path).parent.parent.name, "run": a["run"], "method": a["method"], "mode": a["mode"],
            "dp_guarantee": a["dp_guarantee"], "accounted_epsilon": a["accounted_epsilon"],
            "claimed_epsilon": a.get("claimed_epsilon"), "eps_lower_bound": a["eps_lower_bound"],
            "mechanism_eps_lower_bound": mech, "largest_reachable_lower_bound": a.get("largest_reachable_lower_bound"),
            "canaries": a["canaries"], "delta": f"{a['delta']:g}", "verdict": check}


def write_audit_table(paths: list[str], md_path) -> None:
    rows = [audit_row(p) for p in paths]
    lines = ["# Empirical privacy audit", "",
             "One audit run per row: the run's own method and settings on the private split plus canaries (each in "
             "with probability 1/2). `eps_lower_bound`: input-space canaries scored by the trained model "
             "(Steinke, Nasr and Jagielski 2023, 95% confidence). `mechanism_eps_lower_bound`: gradient canaries "
             "through the same DP-SGD engines (an audit of the mechanism, not of the pipeline). A lower bound at or "
             "below the stated epsilon is consistent with the guarantee but does not prove it; one above it "
             "disproves it. `largest_reachable_lower_bound`: the bound with every guess right, the most this many "
             "canaries can ever show; an epsilon above it cannot be disproved by this audit, and a bound of 0 "
             "against it means the attack found nothing, not that the run leaks nothing. "
             "`claimed_epsilon`: what the paper's printed calibration claims for paper mode. "
             "Curator only: the audit runs trained on the private records.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(format_cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    with atomic_path(md_path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
