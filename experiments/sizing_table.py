"""The table of the dp_sizing checks: each checking set's runs before and after the rule, as in docs/defaults.md.

Reads the comparison tables that ``experiments/sizing_check.sh`` keeps (results/checks/<set>.csv, one per
checking set) and prints, per set, the public and nonprivate rows and every DP run: the CNN accuracy (mean
of the configuration's CNN trainings, with their spread) and the share of the public-to-nonprivate gap it
closes.  A run named ``<name>_before`` is the same run with the sizes set as they were before the rule;
``<name>_r2``, ``_r3``, ... are more trainings of ``<name>`` (new secret noise): a cell then gives the mean
over the trainings and their spread (the standard deviation of the trainings' CNN means).

    .venv/bin/python experiments/sizing_table.py results/checks/*.csv
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from pathlib import Path

from _tables import number


def _cell(rows: list[dict]) -> str:
    if not rows:
        return "not run"
    accs = [number(row["acc_cnn"]) for row in rows]
    gaps = [number(row["gap_closed"]) for row in rows]
    if any(acc is None for acc in accs):
        return "not computed"
    if len(rows) == 1:
        std = number(rows[0]["acc_cnn_std"])
        spread = f" +- {std:.3f}" if std is not None else ""
    else:
        spread = f" +- {statistics.stdev(accs):.3f} over {len(rows)} trainings"
    share = f" ({statistics.mean(gaps):.2f})" if None not in gaps else ""
    return f"{statistics.mean(accs):.3f}{spread}{share}"


def table(path: Path) -> str:
    """The markdown table of one checking set's comparison CSV."""
    groups: dict[str, list[dict]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            groups.setdefault(re.sub(r"_r\d+$", "", row["run"]), []).append(row)
    lines = [f"### {path.stem}", "", "| run | before the rule | with the rule |", "|---|---|---|"]
    for name in ("public", "nonprivate"):
        if name in groups:
            lines.append(f"| {name} | {_cell(groups[name])} | {_cell(groups[name])} |")
    for name in sorted(groups):
        if name in ("public", "nonprivate", "real") or name.endswith("_before"):
            continue
        lines.append(f"| {name} | {_cell(groups.get(name + '_before', []))} | {_cell(groups[name])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", type=Path, help="results/checks/<set>.csv")
    args = parser.parse_args()
    print("CNN accuracy on the real test split, mean +- spread of the CNN trainings, (share of the gap closed)\n")
    print("\n\n".join(table(path) for path in args.tables))


if __name__ == "__main__":
    main()
