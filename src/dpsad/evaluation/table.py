"""The comparison table: a row per dataset and run from the metrics.json files, as CSV and Markdown."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from ..files.atomic import atomic_path

SCOPE = ("Evaluation reads the private training split (evaluator network, memorisation audit, the real row); "
         "these figures are for the data curator and are not covered by the differential privacy guarantee.")

NO_INCEPTION_WEIGHTS = ("not computed: no Inception-v3 weights configured (evaluate.inception_weights: a local file, "
                        "or download where the network is reachable); nothing is downloaded")
COLUMNS = ["dataset", "run", "method", "labels", "target_epsilon", "epsilon", "eps_lower_bound", "delta", "dp_guarantee", "n_samples",
           "fid_evaluator", "is_evaluator", "precision", "recall", "class_fidelity", "acc_logreg", "acc_mlp", "acc_cnn",
           "acc_cnn_std", "cnn_gain_over_public", "gap_closed", "closer_to_train_share", "near_copies", "mia_auc", "fid_inception",
           "is_inception", "kid_inception"]


def comparison_rows(metric_files: list[str], inception_files: list[str] = ()) -> list[dict]:
    """A row per ``results/<dataset>/<run>/metrics.json``, with its Inception figures from the dataset's
    ``results/<dataset>/inception.json`` ({run: figures}; "not computed" for a dataset without one)."""
    inception = {Path(path).parent.name: json.loads(Path(path).read_text()) for path in inception_files}
    rows = []
    for path in metric_files:
        m = json.loads(Path(path).read_text())
        dataset = Path(path).parent.parent.name
        figures = inception.get(dataset, {}).get(m["run"], {})
        acc, mem = m.get("accuracy", {}), m.get("memorization", {})
        rows.append({
            "dataset": dataset, "run": m["run"], "method": m["method"], "labels": m.get("label_source", "true"),
            "target_epsilon": m.get("target_epsilon"),
            "epsilon": m.get("epsilon"), "eps_lower_bound": _audited_lower_bound(Path(path).parent),
            "delta": m.get("delta"), "dp_guarantee": m.get("dp_guarantee"),
            "n_samples": m.get("n_samples"), "fid_evaluator": m.get("fid_evaluator"), "is_evaluator": m.get("is_evaluator"),
            "precision": m.get("precision"), "recall": m.get("recall"),
            "class_fidelity": m.get("evaluator_accuracy_on_synthetic"), "acc_logreg": acc.get("logreg"),
            "acc_mlp": acc.get("mlp"), "acc_cnn": acc.get("cnn"), "acc_cnn_std": acc.get("cnn_std"),
            "closer_to_train_share": mem.get("closer_to_train_share"), "near_copies": mem.get("near_copies"),
            "mia_auc": mem.get("mia_auc"),
            **{key: figures.get(key, NO_INCEPTION_WEIGHTS) for key in ("fid_inception", "is_inception", "kid_inception")},
        })
    return _with_gain_over_public(rows)


def first_acc_cnn(rows: list[dict], method: str) -> dict:
    """{dataset: mean acc_cnn of its first row of ``method``}."""
    found = {}
    for row in rows:
        if row["method"] == method and isinstance(row["acc_cnn"], float):
            found.setdefault(row.get("dataset"), row["acc_cnn"])
    return found


def _with_gain_over_public(rows: list[dict]) -> list[dict]:
    """cnn_gain_over_public: mean acc_cnn minus that of the dataset's first ``public`` row (what epsilon bought);
    gap_closed: that gain over the ``nonprivate`` row's (the share of the public-to-ceiling gap a run closes)."""
    public, ceiling = first_acc_cnn(rows, "public"), first_acc_cnn(rows, "nonprivate")
    for row in rows:
        base, top = public.get(row["dataset"]), ceiling.get(row["dataset"])
        gain = (row["acc_cnn"] - base if base is not None and isinstance(row["acc_cnn"], float)
                and row["method"] not in ("public", "real") else None)
        row["cnn_gain_over_public"] = gain
        row["gap_closed"] = (gain / (top - base) if gain is not None and top is not None and top - base > 0 else None)
    return rows


def _audited_lower_bound(run_dir: Path) -> float | None:
    """The empirical epsilon lower bound of the run's audit (target ``audit``), when one was run."""
    audit = run_dir / "audit.json"
    if not audit.exists():
        return None
    result = json.loads(audit.read_text())
    return max(result["eps_lower_bound"], result.get("mechanism_audit", {}).get("eps_lower_bound") or 0.0)


def format_cell(value) -> str:
    """A table cell: - for None, yes / **no** for booleans, 4 significant digits, n/c for not computed."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    if isinstance(value, str) and value.startswith("not computed"):
        return "n/c"
    return str(value)


def write_comparison(rows: list[dict], csv_path, md_path) -> None:
    with atomic_path(csv_path) as tmp:
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    lines = ["# Comparison of synthetic datasets", "",
             "Accuracy: classifiers trained on each row's data, tested on the real test split (selection on held-out "
             "training data only). FID/IS in the evaluator network's space (not Inception-v3). `dp_guarantee` no: "
             "no differential privacy guarantee. n/c: not computed (see metrics.json). eps_lower_bound: the empirical "
             "lower bound of the run's privacy audit (`audit` target; results/audit.md), - when none was run. "
             "class_fidelity: share of samples the evaluator network assigns to their conditioning class. "
             "labels: what the run is conditioned on; a kmeans run's clusters are read as the public split's "
             "majority class of each cluster (a public map) for every column. "
             "acc_cnn: the mean over several CNN trainings (different seeds) on the same data, acc_cnn_std their "
             "standard deviation. cnn_gain_over_public: acc_cnn minus that of the `public` row (samples of the "
             "public teacher alone, epsilon 0): what the private data bought. gap_closed: that gain as a share of "
             "the nonprivate row's (1: as good as training on the private data without noise). " + SCOPE, "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(format_cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    with atomic_path(md_path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
