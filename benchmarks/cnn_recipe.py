"""The downstream CNN's recipe: is it trained to convergence on each run's released samples?

For each run's ``synthetic.h5`` in a demo's workspace, trains the evaluation's
CNN (``dpsad.evaluation.classifiers``) with several recipes (epochs, batch
size, learning rate), ``--seeds`` times each, on the same fit / selection
split of the samples as ``evaluate`` uses.  Two kinds of figure, kept apart:

- **test-free**: the selection accuracy (on the held-out tenth of the run's
  own samples) and the epoch the selection chose.  A recipe whose chosen
  epoch is mostly its last, and whose selection accuracy still rises with
  more steps, has not converged.  The default is chosen on these alone.
- **curator-only**: the mean and standard deviation of the test-split
  accuracy over the seeds, the figure the comparison table reports.

    .venv/bin/python benchmarks/cnn_recipe.py --workspace . --runs public nonprivate dpsad_eps10 \\
        --recipes b128_e10 b32_e10 b64_e15 --seeds 10
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from dpsad.data.datafile import read_datafile
from dpsad.evaluation.classifiers import ConvNet, accuracy, fit_select, holdout_split, to_float
from dpsad.synthetic import load_synthetic

RECIPES = {  # name: (epochs, batch size, learning rate)
    "b128_e10": (10, 128, 1e-3),
    "b128_e20": (20, 128, 1e-3),
    "b128_e30": (30, 128, 1e-3),
    "b128_e40": (40, 128, 1e-3),
    "b128_e10_lr3e-3": (10, 128, 3e-3),
    "b64_e15": (15, 64, 1e-3),
    "b32_e10": (10, 32, 1e-3),
    "b32_e15": (15, 32, 1e-3),
    "b32_e20": (20, 32, 1e-3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", default=".", help="a demo's directory (its results/<dataset>/ is read)")
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--runs", nargs="+", default=["public", "nonprivate", "dpsad_eps10"])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--seeds", type=int, default=10, help="CNN trainings per run and recipe (seeds 0, 1, ...)")
    parser.add_argument("--holdout", type=float, default=0.1, help="evaluate.holdout_fraction")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = Path(args.workspace) / "results" / args.dataset
    data = read_datafile(results / "data.h5", splits=("test",))
    test = data.splits["test"]
    x_test, y_test = to_float(test.images), torch.from_numpy(test.labels).long()
    print("| run | recipe (epochs, batch, lr) | selection accuracy (test-free) | chosen epochs (test-free) | "
          "test accuracy, mean +- sd (curator-only) | s per training |\n|---|---|---|---|---|---|")
    for run in args.runs:
        synthetic = load_synthetic(results / run / "synthetic.h5")
        metrics_path = results / run / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
        labels = synthetic.labels
        if "cluster_to_class" in metrics:
            # a k-means run: clusters read as the public split's majority class, as the comparison table reads them
            labels = np.asarray(metrics["cluster_to_class"])[labels]
        fit, sel = holdout_split(len(synthetic.images), args.holdout, 0)
        x, y = to_float(synthetic.images), torch.from_numpy(labels).long()
        for name in args.recipes:
            epochs, batch, lr = RECIPES[name]
            chosen, tests = [], []
            start = time.perf_counter()
            for seed in range(args.seeds):
                torch.manual_seed(seed)
                model = ConvNet(x.shape[1], data.num_classes, x.shape[-1])
                chosen.append(fit_select(model, x[fit], y[fit], x[sel], y[sel], epochs=epochs, lr=lr, batch=batch,
                                         seed=seed))
                tests.append(accuracy(chosen[-1].model, x_test, y_test))
            seconds = (time.perf_counter() - start) / args.seeds
            select = [c.select_accuracy for c in chosen]
            print(f"| {run} | {name} ({epochs}, {batch}, {lr:g}) | {np.mean(select):.3f} +- {np.std(select, ddof=1):.3f} "
                  f"| {sorted(c.epoch for c in chosen)} | {np.mean(tests):.3f} +- {np.std(tests, ddof=1):.3f} "
                  f"| {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
