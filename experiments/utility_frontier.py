"""Utility of the DP training levers at one epsilon: one line per lever with epsilon, wall-clock and CNN accuracy.

Each lever trains one DP model (DP-SAD student or DPDM) on the private split of a
prepared ``data.h5`` with the settings of ``config/config.yaml`` plus the lever's
overrides, samples it, and scores the samples the way the ``evaluate`` stage does
(classifiers trained on the samples, tested once on the real test split; the
evaluator network's class fidelity).  The ``public`` line samples the public
teacher alone (epsilon 0).  Needs a finished demo (``make demo``) for the data,
the public teacher and the evaluator:

    .venv/bin/python experiments/utility_frontier.py --levers public dpsad_default dpsad_conditioning dpdm_warm

Every lever reads the private split through its own DP mechanism (recorded in
``results/<dataset>/spent.jsonl``); the printed accuracies are curator-only
figures (see docs/PRIVACY.md), not part of any release, and choosing a default
by them is a decision on the private data: choose defaults on public data
(``dpsad.evaluation.tuning``) instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from dpsad.config import dpdm_settings, student_settings, validate_config
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.evaluate_stage import load_evaluator
from dpsad.evaluation.utility import downstream_accuracy, predict_classes
from dpsad.privacy.books.ledger import read_ledgers, verdict
from dpsad.privacy.books.spent_log import record_spending
from dpsad.sampling import load_any_generator
from dpsad.training.student import train_student
from dpsad.training.dpdm import train_dpdm

ROOT = Path(__file__).resolve().parents[1]

# name: (method, overrides of the method's settings).  Add a line to try a new lever.
LEVERS = {
    "public": ("public", {}),
    "dpsad_default": ("dpsad", {}),
    "dpsad_conditioning": ("dpsad", {"trainable": "conditioning", "lr": 1.0e-3}),
    "dpsad_batch256_e4": ("dpsad", {"batch_size": 256, "epochs": 4, "lr": 5.0e-4}),
    "dpsad_conditioning_b256_e4": ("dpsad", {"trainable": "conditioning", "batch_size": 256, "epochs": 4, "lr": 1.0e-3}),
    "dpsad_public_disc": ("dpsad", {"discriminator": {"privacy": "public"}}),
    "dpsad_no_adv": ("dpsad", {"adv_weight": 0.0, "discriminator": {"privacy": "public"}}),
    "dpdm_warm": ("dpdm", {"init": "public"}),
    "dpdm_scratch": ("dpdm", {"init": "scratch"}),
}


def train(method: str, overrides: dict, config: dict, data, teacher: str, epsilon: float, delta: float, work: Path, log):
    """Train one lever; returns (checkpoint path, ledger paths to compose)."""
    out, ledger = work / "model.pt", work / "ledger.json"
    common = dict(data=data, labels_mode=True, device=torch.device("cpu"), out_path=str(out), loss_csv=str(work / "loss.csv"),
                  ledger_path=str(ledger), log=log)
    teacher_ledger = teacher.replace(".pt", ".ledger.json")
    if method == "dpsad":
        settings = student_settings(config, {"target_epsilon": epsilon, "delta": delta, "student": overrides})
        train_student(teacher_path=teacher, upstream_ledgers=[teacher_ledger], settings=settings, **common)
        return out, [teacher_ledger, ledger]
    settings = dpdm_settings(config, {"target_epsilon": epsilon, "delta": delta, "dpdm": overrides})
    warm = settings.init != "scratch"  # the public teacher given on the command line
    train_dpdm(settings=settings, diffusion_settings=config["diffusion"], stage_name="train_dpdm",
                  init_path=teacher if warm else None, **common)
    return out, ([teacher_ledger] if warm else []) + [ledger]


def score(images, labels, data, evaluator, settings: dict) -> dict:
    acc, _ = downstream_accuracy(images, labels, data.splits["test"].images, data.splits["test"].labels, data.num_classes,
                                 epochs=settings["classifier_epochs"], lr=settings["lr"], batch=settings["classifier_batch_size"],
                                 holdout=settings["holdout_fraction"], seed=settings["seed"])
    return {"class_fidelity": float((predict_classes(evaluator, images) == labels).mean()), **{f"acc_{k}": v for k, v in acc.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    parser.add_argument("--results", default=str(ROOT / "results" / "mnist5k"), help="a finished demo's dataset folder")
    parser.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--n-per-class", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    log = logging.getLogger("utility_frontier")
    config = validate_config(yaml.safe_load(Path(args.config).read_text()), ROOT / "workflow" / "schemas" / "config.schema.yaml")
    results = Path(args.results)
    data = read_datafile(results / "data.h5")
    evaluator = load_evaluator(results / "evaluator.pt")
    teacher = str(results / "teacher" / "public.pt")
    sample_settings = {**config["sample"], "n_per_class": args.n_per_class, "n_samples": None, "seed": 0}
    print(f"epsilon {args.epsilon}, delta {args.delta}; sampler {json.dumps({k: sample_settings[k] for k in ('sampler', 'steps', 'eta')})}, "
          f"{args.n_per_class * data.num_classes} samples")
    print("| lever | method | epsilon | train s | sample s | class_fidelity | acc_logreg | acc_cnn |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.levers:
        method, overrides = LEVERS[name]
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            if method == "public":
                model, ledgers = teacher, [teacher.replace(".pt", ".ledger.json")]
            else:
                model, ledgers = train(method, overrides, config, data, teacher, args.epsilon, args.delta, Path(tmp), log)
                # a training run on the private split: the curator's spending, though nothing is released
                record_spending(results, read_ledgers([str(ledgers[-1])]), source=f"experiments/utility_frontier.py {name}")
            trained = time.perf_counter() - start
            spent = verdict(read_ledgers([str(p) for p in ledgers]), delta=args.delta, accountant="pld", target_epsilon=None,
                            num_private_records=len(data.splits["train"]))
            draw, _ = load_any_generator(model, torch.device("cpu"))
            start = time.perf_counter()
            images, labels = draw(sample_settings).collect()
            sampled = time.perf_counter() - start
            figures = score(images, np.asarray(labels), data, evaluator, config["evaluate"])
        epsilon = f"{spent['epsilon']:.3g}" if spent["dp_guarantee"] else "no guarantee"
        print(f"| {name} | {method} | {epsilon} | {trained:.0f} | {sampled:.0f} | {figures['class_fidelity']:.3f} | "
              f"{figures['acc_logreg']:.3f} | {figures['acc_cnn']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
