"""What a run closes against n x epsilon: the table and plot of docs/budget.md, from experiments/n_epsilon.csv.

Each row of the CSV is a measured cell of docs/defaults.md or the demo's table (its ``table`` column says which):
the share of the gap between the public row and the non-private ceiling that a method closed, the mean of its
trainings and their spread, on a set of n private records at a budget epsilon.

    python experiments/n_epsilon_curve.py                     # rewrite docs/budget.md's table and docs/img/n_epsilon.png
    python experiments/n_epsilon_curve.py --check             # exit 1 when the page's table differs from the CSV
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "experiments" / "n_epsilon.csv"
PAGE = ROOT / "docs" / "budget.md"
PLOT = ROOT / "docs" / "img" / "n_epsilon.png"
# more methods than the default cycle's 10 colours, none two alike
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:grey",
           "tab:olive", "tab:cyan", "black", "gold", "navy", "lime")
BLOCK = re.compile(r"(<!-- table: n_epsilon -->\n)(.*?)(<!-- end table -->)", re.S)


def read_rows(path: Path = CSV) -> list[dict]:
    """The CSV's rows, n x epsilon added, in order of n x epsilon, then set, then method."""
    with open(path, newline="") as handle:
        rows = [dict(row, n_epsilon=int(row["n"]) * float(row["epsilon"])) for row in csv.DictReader(handle)]
    return sorted(rows, key=lambda row: (row["n_epsilon"], row["set"], row["method"]))


def markdown_table(rows: list[dict]) -> str:
    lines = ["| n x epsilon | set (n) | epsilon | method | gap closed | trainings | from |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        spread = f" +- {float(row['spread']):.2f}" if row["spread"] else ""
        lines.append(f"| {row['n_epsilon']:,.0f} | `{row['set']}` ({int(row['n']):,}) | {float(row['epsilon']):g} | "
                     f"{row['method']} | {float(row['gap_closed']):.2f}{spread} | {row['trainings']} | {row['table']} |")
    return "\n".join(lines) + "\n"


FLOOR = -0.5  # the axis's bottom: a lever that lost more is drawn there, its value written beside it


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 6.0))
    markers = "osD^vP*X"
    for number, method in enumerate(dict.fromkeys(row["method"] for row in rows)):
        own = [row for row in rows if row["method"] == method]
        gaps = [float(row["gap_closed"]) for row in own]
        bars = ax.errorbar([row["n_epsilon"] for row in own], [max(gap, FLOOR) for gap in gaps],
                           yerr=[0 if gap < FLOOR else float(row["spread"] or 0) for gap, row in zip(gaps, own)],
                           fmt=markers[number % len(markers)], capsize=3, label=method, alpha=0.85,
                           color=COLOURS[number % len(COLOURS)])
        for row, gap in zip(own, gaps):  # below the axis: drawn on its floor, with the value written beside it
            if gap < FLOOR:
                ax.annotate(f"{gap:.2f}", (row["n_epsilon"], FLOOR), textcoords="offset points", xytext=(6, 2),
                            fontsize=7, color=bars[0].get_color())
    ax.set_ylim(bottom=FLOOR - 0.05)
    for target in (0.3, 0.6):
        ax.axhline(target, color="grey", lw=0.6, ls=":")
    ax.axhline(0, color="black", lw=0.6)
    ax.axhline(1, color="black", lw=0.6, ls="--")  # the non-private ceiling: a renderer of the records' own kind passes it
    ax.set_xscale("log")
    ax.set_xlabel("n x epsilon (private records x budget)")
    ax.set_ylabel("gap closed (public row 0, non-private 1)")
    ax.set_title("What a run closes against n x epsilon (CNN on the synthetic data)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # the legend below the axes, whole
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page's table differs from the CSV")
    args = parser.parse_args(argv)
    rows = read_rows(args.csv)
    text = args.page.read_text()
    if not BLOCK.search(text):
        print(f"error: {args.page} has no '<!-- table: n_epsilon -->' block, expected one", file=sys.stderr)
        return 1
    written = BLOCK.sub(lambda m: m.group(1) + markdown_table(rows) + m.group(3), text)
    if args.check:
        if written != text:
            print(f"error: {args.page}'s table differs from {args.csv}, expected python experiments/n_epsilon_curve.py",
                  file=sys.stderr)
            return 1
        return 0
    args.page.write_text(written)
    plot(rows, args.plot)
    print(f"wrote {args.page} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
