"""What DP compute buys: DP-SAD and DPDM at 1x, 2x, 4x and 8x the demo's example gradients, and the warm-up
curriculum, on a checking set (**curator-only**: every DP training reads the set's private records and is
recorded in the curator's ``spent.jsonl``; the CNN figures read its test split).

``config SET``: writes ``results/compute/SET.yaml``, an overlay of ``config/checks/SET.yaml`` (``demo``: of the
demo's own configuration, its records included) whose runs are

- ``<method>_eps<e>_x<m>``: the run at ``m`` times ``dp_sizing.example_gradients``, its expected batch and steps
  the ones the sizing rule gives at that compute for the set's n (read from its prepared ``data.h5``: run
  ``snakemake results/SET/data.h5`` first), set explicitly because one configuration has one ``dp_sizing``;
- ``dpsad_eps<e>_curriculum``: the warm-up curriculum with public data at 1x: the public teacher fine-tuned on
  the private split's central images (``central.epsilon`` of the budget, composed into the run), then DP-SAD
  with the rest of the run's epsilon;
- ``..._r2``, ``_r3``: more trainings (new secret noise) with ``--trainings``.

``table CSV [--bench LOGS]``: the table (mean gap_closed, its spread and the number of trainings per cell, the
mean seconds of a training from ``LOGS/<dataset>/*.bench.tsv``) and the plot ``--plot PNG``.

    bash experiments/compute_check.sh mnist2k --trainings 2     # prepares the set, then config, the runs, table
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from pathlib import Path

import yaml
from _tables import job_seconds, number
from snakemake.utils import update_config

from dpsad.config import validate_config
from dpsad.config.resources import read_prepared_shape
from dpsad.privacy.mechanism.plan import size_dp_training

ROOT = Path(__file__).resolve().parents[1]
MULTIPLES = (1, 2, 4, 8)
SETTINGS = (("dpsad", 10.0), ("dpsad", 1.0), ("dpdm", 10.0))  # the method and epsilon of each line
# The curriculum's warm-up is the DP central images of config/examples/no_public.yaml (epsilon 0.2).
NO_PUBLIC = ROOT / "config" / "examples" / "no_public.yaml"
CURRICULUM_TEACHER = {"split": "central", "init": "public", "steps": 300, "batch_size": 64, "lr": 1.0e-3,
                      "ema_decay": 0.99, "warmup_steps": 50, "label_dropout": 0.1, "checkpoint_every": 100}


def sized_run(method: str, epsilon: float, multiple: int, n: int, rule: dict, suffix: str) -> dict:
    """One run at ``multiple`` times the compute: the rule's batch, and epochs that give exactly its steps."""
    size = size_dp_training(n, epsilon, 1e-5, example_gradients=multiple * rule["example_gradients"],
                            min_steps=rule["min_steps"], target_snr=rule["target_snr"],
                            max_sample_rate=rule["max_sample_rate"], min_batch_size=rule["min_batch_size"])
    # steps = ceil(epochs / (B / n)): a quarter step below the rule's steps rounds up to them
    epochs = round((size.steps - 0.25) * size.batch_size / n, 9)
    run = {"name": f"{method}_eps{epsilon:g}_x{multiple}{suffix}", "method": method, "target_epsilon": epsilon,
           "delta": 1.0e-5, {"dpsad": "student"}.get(method, method): {"batch_size": size.batch_size, "epochs": epochs}}
    if method == "dpsad":
        run["teacher"] = "public"
    return run


def checking_overlay(checking_set: str) -> dict:
    """``config/checks/SET.yaml``, or for ``demo`` the demo's own records with nothing released (measured there,
    chosen nowhere: these runs are not the demo's)."""
    if checking_set == "demo":
        (dataset,) = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["datasets"]
        return {"data": {dataset: {"release": []}}}
    return yaml.safe_load((ROOT / "config" / "checks" / f"{checking_set}.yaml").read_text())


def write_config(checking_set: str, trainings: int, multiples: tuple[int, ...], only: str | None = None) -> Path:
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    overlay = checking_overlay(checking_set)
    update_config(base, {k: v for k, v in overlay.items() if k != "runs"})
    config = validate_config(base)
    dataset = config["datasets"][0]
    shape = read_prepared_shape(Path("results") / dataset / "data.h5")
    if shape is None:
        raise SystemExit(f"results/{dataset}/data.h5 is missing: prepare it first (snakemake results/{dataset}/data.h5)")
    rule = config["dp_sizing"]
    runs = [{"name": "public", "method": "public", "teacher": "public"},
            {"name": "nonprivate", "method": "nonprivate", "teacher": "private"}]
    for trial in range(1, trainings + 1):
        suffix = "" if trial == 1 else f"_r{trial}"
        for method, epsilon in SETTINGS:
            runs += [sized_run(method, epsilon, m, shape.private, rule, suffix) for m in multiples]
        runs += [{"name": f"dpsad_eps{epsilon:g}_curriculum{suffix}", "method": "dpsad", "teacher": "public_central",
                  "target_epsilon": epsilon, "delta": 1.0e-5} for epsilon in (10.0, 1.0)]
    if only:
        runs = runs[:2] + [run for run in runs[2:] if re.fullmatch(only, run["name"])]
    out = {**{k: v for k, v in overlay.items() if k != "runs"}, "central": yaml.safe_load(NO_PUBLIC.read_text())["central"],
           "teachers": {"public_central": CURRICULUM_TEACHER}, "runs": runs}
    path = Path("results") / "compute" / f"{checking_set}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# written by experiments/compute_table.py for n = {shape.private} private records\n"
                    + yaml.safe_dump(out, sort_keys=False))
    print(f"{path}: {len(runs)} runs over {dataset} (n = {shape.private})")
    return path


def cells(path: Path, bench: Path | None) -> dict:
    """{(dataset, line, multiple or 'curriculum'): (gaps, seconds)} from one comparison CSV."""
    out: dict = {}
    seconds_of = job_seconds(bench) if bench is not None else {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            match = re.fullmatch(r"(dpsad|dpdm)_eps([\d.]+)_(x(\d+)|curriculum)(_r\d+)?", row["run"])
            if not match:
                continue
            where = int(match.group(4)) if match.group(4) else "curriculum"
            key = (row["dataset"], f"{match.group(1)} eps {match.group(2)}", where)
            gaps, seconds = out.setdefault(key, ([], []))
            gap = number(row["gap_closed"])
            if gap is not None:
                gaps.append(gap)
            seconds += [seconds_of[job] for job in (f"{row['dataset']}/{rule}_{row['run']}"
                                                    for rule in ("distill_student", "train_dpdm")) if job in seconds_of]
    return out


def _cell(gaps: list[float]) -> str:
    if not gaps:
        return "not computed"
    if len(gaps) == 1:
        return f"{gaps[0]:.2f} (1)"
    return f"{statistics.mean(gaps):.2f} +- {statistics.stdev(gaps):.2f} ({len(gaps)})"


def print_table(found: dict) -> None:
    columns = sorted({where for _, _, where in found if where != "curriculum"}) + ["curriculum"]
    for dataset in sorted({d for d, _, _ in found}):
        print(f"\n### {dataset}: gap_closed, mean +- spread (trainings); seconds a training\n")
        print("| method | " + " | ".join(f"{c}x" if c != "curriculum" else "curriculum (1x)" for c in columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for line in sorted({l for d, l, _ in found if d == dataset}):
            row = []
            for column in columns:
                gaps, seconds = found.get((dataset, line, column), ([], []))
                time = f", {statistics.mean(seconds):.0f} s" if seconds else ""
                row.append(_cell(gaps) + time if gaps or seconds else "not run")
            print(f"| {line} | " + " | ".join(row) + " |")


def plot(found: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({d for d, _, _ in found})
    figure, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.6), squeeze=False)
    for axis, dataset in zip(axes[0], datasets):
        for line in sorted({l for d, l, _ in found if d == dataset}):
            points = sorted((w, g) for (d, l, w), (g, _) in found.items() if d == dataset and l == line
                            and w != "curriculum" and g)
            if not points:
                continue
            xs = [w for w, _ in points]
            axis.errorbar(xs, [statistics.mean(g) for _, g in points],
                          yerr=[statistics.stdev(g) if len(g) > 1 else 0 for _, g in points], marker="o",
                          capsize=3, label=line)
        axis.set_xscale("log", base=2)
        multiples = sorted({w for d, _, w in found if d == dataset and w != "curriculum"})
        axis.set_xticks(multiples, [f"{m}x" for m in multiples])
        axis.set_xlabel("compute (x the demo's example gradients)")
        axis.set_ylabel("gap closed")
        axis.set_title(dataset)
        axis.axhline(0, color="grey", lw=0.5)
        axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="write the runs of a checking set")
    config.add_argument("checking_set", help="a set of config/checks/, or demo")
    config.add_argument("--trainings", type=int, default=1)
    config.add_argument("--multiples", type=int, nargs="+", default=list(MULTIPLES))
    config.add_argument("--only", help="a regular expression: keep the DP runs whose whole name it matches")
    table = commands.add_parser("table", help="the table (and plot) of comparison CSVs")
    table.add_argument("csv", type=Path, nargs="+")
    table.add_argument("--bench", type=Path, help="the logs folder of the runs (their *.bench.tsv)")
    table.add_argument("--plot", type=Path)
    args = parser.parse_args()
    if args.command == "config":
        write_config(args.checking_set, args.trainings, tuple(args.multiples), args.only)
        return
    found: dict = {}
    for path in args.csv:
        for key, (gaps, seconds) in cells(path, args.bench).items():
            found.setdefault(key, ([], []))
            found[key][0].extend(gaps)
            found[key][1].extend(seconds)
    print_table(found)
    if args.plot:
        plot(found, args.plot)


if __name__ == "__main__":
    main()
