"""Sampler and guidance chosen by measured utility: images/s and the accuracy of each setting's samples.

For one trained generator (the public teacher of a finished demo), draws the
same number of images with each sampler setting and scores them on the public
split only (``dpsad.evaluation.tuning``: an evaluator fitted on one half of the
public split, classifiers trained on the samples and tested on the other half),
so that the chosen default reads no private and no test record:

    .venv/bin/python benchmarks/sampler_choice.py --model results/mnist5k/teacher/public.pt

``--score curator`` scores like the ``evaluate`` stage instead (the evaluator
trained on the private split, the test split): curator-only figures, never
for choosing a default.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from utility_frontier import ROOT, score

from dpsad.config import validate_config
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.report import load_evaluator
from dpsad.evaluation.tuning import PublicScorer
from dpsad.sampling import load_any_generator

SETTINGS = [
    {"sampler": "ddim", "steps": 50, "eta": 1.0, "guidance": 0.0},
    {"sampler": "ddim", "steps": 20, "eta": 1.0, "guidance": 0.0},
    {"sampler": "ddim", "steps": 15, "eta": 1.0, "guidance": 0.0},
    {"sampler": "ddim", "steps": 10, "eta": 1.0, "guidance": 0.0},
    {"sampler": "dpmpp_2m", "steps": 10, "eta": 0.0, "guidance": 0.0},
    {"sampler": "dpmpp_2m", "steps": 15, "eta": 0.0, "guidance": 0.0},
]


def load_config() -> dict:
    return validate_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()),
                           ROOT / "workflow" / "schemas" / "config.schema.yaml")


def sampler_rows(model, results: Path, settings: list[dict], n_per_class: int, config: dict, scorer=None):
    """For each sampler setting: images/s and the figures of its samples; yields dicts.

    ``scorer(images, labels) -> dict``; by default the evaluate stage's figures (curator-only).
    """
    if scorer is None:
        data = read_datafile(results / "data.h5")
        evaluator = load_evaluator(results / "evaluator.pt")

        def scorer(images, labels):
            return score(images, labels, data, evaluator, config["evaluate"])

    draw, _ = load_any_generator(str(model), torch.device("cpu"))
    for setting in settings:
        start = time.perf_counter()
        images, labels = draw({**setting, "n_per_class": n_per_class, "n_samples": None, "batch_size": 250,
                               "seed": 0}).collect()
        rate = len(images) / (time.perf_counter() - start)
        yield {**setting, "images": len(images), "images_per_s": rate, **scorer(images, np.asarray(labels))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a generator checkpoint")
    parser.add_argument("--results", default=str(ROOT / "results" / "mnist5k"), help="the demo's dataset folder")
    parser.add_argument("--n-per-class", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--score", choices=("public", "curator"), default="public")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config()
    scorer, suffix = None, ""
    if args.score == "public":
        scorer = PublicScorer(read_datafile(Path(args.results) / "data.h5"), config["evaluate"],
                              logging.getLogger("sampler_choice"))
        suffix = "_public"
    rows = sampler_rows(args.model, Path(args.results), SETTINGS, args.n_per_class, config, scorer)
    print(f"{args.model}: {args.n_per_class} samples per class and setting; scored on the "
          + ("public split's held-out half" if scorer else "private-trained evaluator and the test split (curator only)"))
    print("| sampler | steps | eta | guidance | images/s | class_fidelity | acc_logreg | acc_cnn |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sampler']} | {r['steps']} | {r['eta']} | {r['guidance']} | {r['images_per_s']:.1f} | "
              f"{r['class_fidelity' + suffix]:.3f} | {r['acc_logreg' + suffix]:.3f} | {r['acc_cnn' + suffix]:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
