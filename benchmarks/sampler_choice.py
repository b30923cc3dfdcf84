"""Sampler and guidance chosen by measured utility: images/s and the CNN accuracy of each setting's samples.

For one trained generator (a teacher, student or DPDM checkpoint of a finished
demo), draws the same number of images with each sampler setting and scores them
like the ``evaluate`` stage (classifiers trained on the samples, tested on the
real test split; the evaluator network's class fidelity):

    .venv/bin/python benchmarks/sampler_choice.py --model results/mnist5k/teacher/public.pt
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from utility_frontier import ROOT, score

from dpsad.config import validate_config
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.report import load_evaluator
from dpsad.sampling import load_any_generator

SETTINGS = [
    {"sampler": "ddim", "steps": 50, "eta": 1.0, "guidance": 0.0},
    {"sampler": "ddim", "steps": 20, "eta": 1.0, "guidance": 0.0},
    {"sampler": "ddim", "steps": 15, "eta": 1.0, "guidance": 0.0},
    {"sampler": "ddim", "steps": 10, "eta": 1.0, "guidance": 0.0},
    {"sampler": "dpmpp_2m", "steps": 10, "eta": 0.0, "guidance": 0.0},
    {"sampler": "dpmpp_2m", "steps": 15, "eta": 0.0, "guidance": 0.0},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a generator checkpoint")
    parser.add_argument("--results", default=str(ROOT / "results" / "mnist5k"), help="the demo's dataset folder")
    parser.add_argument("--n-per-class", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = validate_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()),
                             ROOT / "workflow" / "schemas" / "config.schema.yaml")
    results = Path(args.results)
    data = read_datafile(results / "data.h5")
    evaluator = load_evaluator(results / "evaluator.pt")
    draw, _ = load_any_generator(args.model, torch.device("cpu"))
    print(f"{args.model}: {args.n_per_class * data.num_classes} samples per setting")
    print("| sampler | steps | eta | guidance | images/s | class_fidelity | acc_logreg | acc_cnn |")
    print("|---|---|---|---|---|---|---|---|")
    for setting in SETTINGS:
        settings = {**setting, "n_per_class": args.n_per_class, "n_samples": None, "batch_size": 250, "seed": 0}
        start = time.perf_counter()
        images, labels = draw(settings).collect()
        rate = len(images) / (time.perf_counter() - start)
        figures = score(images, np.asarray(labels), data, evaluator, config["evaluate"])
        print(f"| {setting['sampler']} | {setting['steps']} | {setting['eta']} | {setting['guidance']} | {rate:.1f} | "
              f"{figures['class_fidelity']:.3f} | {figures['acc_logreg']:.3f} | {figures['acc_cnn']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
