"""How often a k-means-conditioned generator draws its cluster's majority class, at several guidance scales.

Draws ``--n-per-class`` samples per cluster with DDIM-10 from a checkpoint (a
``public_kmeans`` teacher or a k-means run's student), labels them with the
demo's evaluator network and prints the share that matches the cluster's
majority public class (the run's ``cluster_to_class`` in its metrics.json):

    .venv/bin/python benchmarks/cluster_agreement.py --model results/mnist5k/teacher/public_kmeans.pt
    .venv/bin/python benchmarks/cluster_agreement.py --model results/mnist5k/dpsad_kmeans_eps10/student.pt --guidance 0 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dpsad.evaluation.report import load_evaluator
from dpsad.evaluation.utility import predict_classes
from dpsad.sampling import load_any_generator

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a generator conditioned on k-means clusters")
    parser.add_argument("--results", default=str(ROOT / "results" / "mnist5k"), help="the demo's dataset folder")
    parser.add_argument("--run", default="dpsad_kmeans_eps10", help="the k-means run whose metrics.json holds cluster_to_class")
    parser.add_argument("--guidance", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    parser.add_argument("--n-per-class", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = Path(args.results)
    to_class = np.array(json.loads((results / args.run / "metrics.json").read_text())["cluster_to_class"])
    evaluator = load_evaluator(results / "evaluator.pt")
    draw, _ = load_any_generator(args.model, torch.device("cpu"))
    print(f"{args.model}: {args.n_per_class} samples per cluster, DDIM-10")
    print("| guidance | agreement with the cluster's majority class |")
    print("|---|---|")
    for guidance in args.guidance:
        images, clusters = draw({"sampler": "ddim", "steps": 10, "eta": 1.0, "guidance": guidance,
                                 "n_per_class": args.n_per_class, "n_samples": None, "batch_size": 300, "seed": 0}).collect()
        agreement = float((predict_classes(evaluator, images) == to_class[np.asarray(clusters)]).mean())
        print(f"| {guidance:g} | {agreement:.3f} |", flush=True)


if __name__ == "__main__":
    main()
