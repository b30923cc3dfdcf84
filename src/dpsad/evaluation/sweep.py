"""The sweep target's table: CNN accuracy per method and epsilon, and the public (epsilon 0) reference."""

from __future__ import annotations

import csv

from ..files.atomic import atomic_path
from .table import first_acc_cnn

REFERENCES = ("public", "nonprivate")


def sweep_table(rows: list[dict]) -> dict:
    """{"points": [(method, epsilon spent, acc_cnn, acc_cnn_std)], "public": ..., "nonprivate": ...}.

    ``public`` and ``nonprivate`` are the mean CNN accuracy of the first row of that method (None when absent):
    the epsilon-0 floor and the no-noise ceiling.  Rows without a guarantee or without a CNN accuracy are left
    out of the points.
    """
    points = sorted((row["method"], float(row["epsilon"]), float(row["acc_cnn"]), float(row.get("acc_cnn_std") or 0.0))
                    for row in rows if row["method"] not in REFERENCES and row["dp_guarantee"]
                    and isinstance(row["acc_cnn"], float))
    return {"points": points, **{method: next(iter(first_acc_cnn(rows, method).values()), None) for method in REFERENCES}}


def write_sweep(table: dict, path) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["method", "epsilon", "acc_cnn", "acc_cnn_std", "public_acc_cnn", "nonprivate_acc_cnn"])
            for method, epsilon, accuracy, spread in table["points"]:
                writer.writerow([method, epsilon, accuracy, spread, table["public"], table["nonprivate"]])
