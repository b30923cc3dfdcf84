"""The sweep target's table: CNN accuracy per method and epsilon, and the public (epsilon 0) reference."""

from __future__ import annotations

import csv

from ..atomic import atomic_path


def sweep_table(rows: list[dict]) -> dict:
    """{"points": [(method, epsilon spent, acc_cnn)], "public": acc_cnn of the first public row or None}.

    Rows without a guarantee or without a CNN accuracy are left out of the points.
    """
    public = next((row["acc_cnn"] for row in rows if row["method"] == "public" and isinstance(row["acc_cnn"], float)), None)
    points = sorted((row["method"], float(row["epsilon"]), float(row["acc_cnn"])) for row in rows
                    if row["method"] != "public" and row["dp_guarantee"] and isinstance(row["acc_cnn"], float))
    return {"points": points, "public": public}


def write_sweep(table: dict, path) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["method", "epsilon", "acc_cnn", "public_acc_cnn"])
            for method, epsilon, accuracy in table["points"]:
                writer.writerow([method, epsilon, accuracy, table["public"]])
