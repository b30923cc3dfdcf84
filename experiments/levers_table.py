"""The table of levers on a checking set: each cell's trainings, CNN accuracy and share of the gap closed.

Reads ``results/<dataset>/<run>/metrics.json`` of the runs named (after ``snakemake`` built them with the set's
overlay, e.g. ``make demo TARGET="results/mnist2k/pe_eps1/metrics.json ..." ARGS="--configfile
config/config.yaml config/checks/mnist2k.yaml"``), the ``public`` and ``nonprivate`` rows beside them, and the
training seconds of each run from ``logs/<dataset>/*.bench.tsv``.  Runs that differ only by a ``_r<k>`` suffix
are trainings of one cell (new secret noise).  **Curator-only**: the figures read the test split.

    python experiments/levers_table.py mnist2k pe_eps1 pe_eps1_r2 dpsad_eps1 dpsad_eps1_r2
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from _tables import job_seconds

TRAINING_RULES = ("distill_student", "train_dpdm", "train_dpgan", "train_pe")


def cnn(results: Path, run: str) -> float | None:
    path = results / run / "metrics.json"
    return json.loads(path.read_text())["accuracy"]["cnn"] if path.is_file() else None


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.3f}" + (f" +- {statistics.stdev(values):.3f}" if len(values) > 1 else "")


def table(root: Path, dataset: str, runs: list[str], rows_beside: tuple[str, str] = ("public", "nonprivate")) -> list[str]:
    """Markdown rows: cell, trainings, CNN mean +- spread, gap closed mean +- spread, mean seconds of a training.
    ``rows_beside``: the runs of the public and non-private rows the gap is measured between (drawn at the cells'
    release size)."""
    results = root / "results" / dataset
    floor, ceiling = (cnn(results, run) for run in rows_beside)
    if floor is None or ceiling is None:
        raise SystemExit(f"results/{dataset}/{rows_beside[0]} and {rows_beside[1]} metrics are missing, expected both "
                         "built first")
    seconds = job_seconds(root / "logs")
    cells: dict[str, list[str]] = {}
    for run in runs:
        cells.setdefault(re.sub(r"_r\d+$", "", run), []).append(run)
    rows = ["| cell | trainings | CNN accuracy | gap closed | training s |", "|---|---|---|---|---|",
            f"| {rows_beside[0]} | 1 | {floor:.3f} | 0 | |", f"| {rows_beside[1]} | 1 | {ceiling:.3f} | 1 | |"]
    for cell, members in cells.items():
        accuracies = [a for a in (cnn(results, run) for run in members) if a is not None]
        if not accuracies:
            rows.append(f"| {cell} | 0 | not computed: no metrics.json yet | | |")
            continue
        gaps = [(a - floor) / (ceiling - floor) for a in accuracies]
        times = [seconds[f"{dataset}/{rule}_{run}"] for run in members for rule in TRAINING_RULES
                 if f"{dataset}/{rule}_{run}" in seconds]
        rows.append(f"| {cell} | {len(accuracies)} | {spread(accuracies)} | {spread(gaps)} | "
                    f"{statistics.fmean(times):.0f} |" if times else
                    f"| {cell} | {len(accuracies)} | {spread(accuracies)} | {spread(gaps)} | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rows", nargs=2, default=("public", "nonprivate"), metavar=("PUBLIC", "NONPRIVATE"),
                        help="the runs of the public and non-private rows (default: public nonprivate)")
    args = parser.parse_args()
    print("\n".join(table(args.root, args.dataset, args.runs, tuple(args.rows))))


if __name__ == "__main__":
    main()
