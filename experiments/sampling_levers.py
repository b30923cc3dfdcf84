"""Sampling levers on trained checkpoints: CNN accuracy of their samples and the share of the gap closed.

Draws each run's images again with the ``sample`` settings the runs were built with (``config/config.yaml`` and the
overlays given by ``--config``), one of them changed per ``--set`` (e.g.
``guidance=1.0``), trains the evaluation's classifiers on them (``evaluate`` settings: 3 CNN trainings) and scores
them on the **test split**: curator-only figures, like the comparison table.  Sampling is post-processing of the
checkpoints, so nothing here spends privacy.  The ``public`` and ``nonprivate`` rows are drawn with the same
settings, so each run's ``gap_closed`` is against its own floor and ceiling (a setting that lowers the ceiling more
than a run "closes" more of a smaller gap: read the accuracies too)::

    PYTHONPATH=src .venv/bin/python experiments/sampling_levers.py mnist2k dpsad_eps10 dpdm_eps10 \\
        --config config/checks/mnist2k.yaml --set guidance=1.0

A run is named by its directory under ``results/<dataset>/``; its generator is the file that stage wrote there
(``student.pt``, ``dpdm.pt``), and ``public``/``nonprivate`` are the two teachers.  One JSON line a run on
standard output, with the sample settings it was drawn with.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from dpsad.config import validate_config
from dpsad.config.stages import deep_merge
from dpsad.data.datafile import read_datafile
from dpsad.errors import DpsadError
from dpsad.evaluation.utility import downstream_accuracy
from dpsad.sampling import load_any_generator

from _tables import add_built_runs_arguments, layered_config

GENERATORS = ("student.pt", "dpdm.pt")


def generator_path(results: Path, run: str, method: str | None) -> Path:
    """The diffusion checkpoint a run's sampling stage reads (``method``: the configured run's, else None)."""
    if run in ("public", "nonprivate"):
        return results / "teacher" / ("public.pt" if run == "public" else "private.pt")
    if method == "pe" or (results / run / "pe.pt").is_file():  # a dpdm.pt there is what PE evolved, not its set
        raise SystemExit(f"run '{run}': Private Evolution, expected a diffusion run: a PE population is not drawn "
                         "again from a generator")
    for name in GENERATORS:
        if (results / run / name).is_file():
            return results / run / name
    raise SystemExit(f"run '{run}': no {' or '.join(GENERATORS)} in {results / run}, expected a built diffusion run")


def score(checkpoint: Path, sample: dict, evaluate: dict, test, num_classes: int) -> dict:
    """The CNN accuracy on ``test`` of a classifier trained on ``checkpoint``'s samples, with timings."""
    draw, _ = load_any_generator(checkpoint, torch.device("cpu"), use_ema=sample["use_ema"])
    start = time.time()
    images, labels = draw(sample).collect()
    sampled = time.time() - start
    acc, _ = downstream_accuracy(images, labels, test.images, test.labels, num_classes,
                                 epochs=evaluate["classifier_epochs"], lr=evaluate["lr"],
                                 batch=evaluate["classifier_batch_size"], holdout=evaluate["holdout_fraction"],
                                 seed=evaluate["seed"], cnn_trainings=evaluate["cnn_trainings"])
    return {"acc_cnn": round(acc["cnn"], 4), "acc_cnn_std": round(acc["cnn_std"], 4),
            "sample_s": round(sampled, 1), "evaluate_s": round(time.time() - start - sampled, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_built_runs_arguments(parser, "run directories under results/<dataset>/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="change a sample setting, e.g. guidance=1.0")
    args = parser.parse_args()

    torch.set_num_threads(2)
    results = Path(args.workspace) / "results" / args.dataset
    layered = layered_config(parser, args.config)
    overrides = {}
    known = validate_config(copy.deepcopy(layered))["sample"]
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in known:
            parser.error(f"--set {item}: '{key}' is not a sample setting, expected one of {', '.join(known)}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item}: '{value}' is not a JSON value, expected e.g. guidance=1.0 or sampler=\"ddpm\"")
    try:
        config = validate_config(deep_merge(layered, {"sample": overrides}))
    except DpsadError as error:
        parser.error(f"--set: {error}")
    sample, evaluate = config["sample"], config["evaluate"]
    methods = {run["name"]: run["method"] for run in config["runs"]}
    generators = {run: generator_path(results, run, methods.get(run))
                  for run in dict.fromkeys(["public", "nonprivate", *args.runs])}
    data = read_datafile(results / "data.h5", splits=("test",))
    test = data.splits["test"]
    rows = {run: score(path, sample, evaluate, test, data.num_classes) for run, path in generators.items()}
    floor, ceiling = rows["public"]["acc_cnn"], rows["nonprivate"]["acc_cnn"]
    for run, row in rows.items():
        row["gap_closed"] = (round((row["acc_cnn"] - floor) / (ceiling - floor), 3) if ceiling != floor else
                             "not computed: the public and nonprivate rows are level")
        print(json.dumps({"dataset": args.dataset, "run": run, "sample": sample, **row}), flush=True)
    trained = [row["gap_closed"] for run, row in rows.items()
               if run not in ("public", "nonprivate") and ceiling != floor]
    if len(trained) > 1:
        print(f"mean gap closed of the {len(trained)} runs: {statistics.fmean(trained):.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
