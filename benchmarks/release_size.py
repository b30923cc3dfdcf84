"""Release size and sampler settings: CNN accuracy of trained checkpoints' samples, and the share of the gap closed.

Draws ``--sizes`` images per class from each checkpoint with the ``sample``
settings of ``--config`` (overridden by ``--set key=value``), trains the
evaluation's classifiers on them (``evaluate`` settings: 3 CNN trainings) and
scores them on the **test split**: curator-only figures, like the comparison
table.  Sampling is post-processing of the checkpoints, so nothing here spends
privacy; but a default chosen from these scores is a decision on the test
split of the developers' copy, and is reported as such.  With ``--public`` and
``--nonprivate`` it prints each run's gap_closed against those two rows at
the same size and settings::

    .venv/bin/python benchmarks/release_size.py --workspace . --sizes 100 200 \\
        --public teacher/public.pt --nonprivate teacher/private.pt dpsad_eps10=dpsad_eps10/student.pt
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml

from dpsad.config import load_schema, validate_against
from dpsad.data.datafile import read_datafile
from dpsad.evaluation.utility import downstream_accuracy
from dpsad.sampling import load_any_generator


def section_defaults(config_path: str, name: str) -> dict:
    """The schema's defaults for section ``name`` overlaid with that section of ``config_path``."""
    schema = load_schema()
    section = yaml.safe_load(Path(config_path).read_text()).get(name, {})
    return validate_against(dict(section), schema["properties"][name] | {"$defs": schema["$defs"]}, name)


def score(checkpoint: Path, n_per_class: int, sample: dict, evaluate: dict, test, num_classes: int) -> dict:
    """Sample ``n_per_class`` images per class from ``checkpoint``; the CNN accuracy on ``test``, with timings."""
    draw, _ = load_any_generator(checkpoint, torch.device("cpu"), use_ema=sample["use_ema"])
    start = time.time()
    images, labels = draw(dict(sample, n_per_class=n_per_class, n_samples=None)).collect()
    sampled = time.time() - start
    acc, _ = downstream_accuracy(images, labels, test.images, test.labels, num_classes,
                                 epochs=evaluate["classifier_epochs"], lr=evaluate["lr"], batch=evaluate["classifier_batch_size"],
                                 holdout=evaluate["holdout_fraction"], seed=evaluate["seed"],
                                 cnn_trainings=evaluate["cnn_trainings"])
    return {"acc_cnn": acc["cnn"], "acc_cnn_std": acc["cnn_std"], "sample_s": round(sampled, 1),
            "evaluate_s": round(time.time() - start - sampled, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workspace", default=".", help="a demo's directory (its results/<dataset>/ is read)")
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--config", default="config/config.yaml", help="sample and evaluate settings")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200], help="images per class")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="override a sample setting, e.g. steps=20 or use_ema=false")
    parser.add_argument("--public", help="the public row's checkpoint, relative to results/<dataset>/")
    parser.add_argument("--nonprivate", help="the non-private row's checkpoint")
    parser.add_argument("runs", nargs="*", metavar="NAME=CHECKPOINT", help="checkpoints relative to results/<dataset>/")
    args = parser.parse_args()

    torch.set_num_threads(2)
    root = Path(args.workspace) / "results" / args.dataset
    sample, evaluate = section_defaults(args.config, "sample"), section_defaults(args.config, "evaluate")
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in sample:
            parser.error(f"--set {item}: '{key}' is not a sample setting, expected one of {', '.join(sample)}")
        sample[key] = json.loads(value)
    data = read_datafile(root / "data.h5")
    test = data.splits["test"]
    named = ([("public", args.public)] if args.public else []) + \
            ([("nonprivate", args.nonprivate)] if args.nonprivate else []) + [r.split("=", 1) for r in args.runs]
    for n in args.sizes:
        rows = {name: score(root / path, n, sample, evaluate, test, data.num_classes) for name, path in named}
        ends = rows.get("public"), rows.get("nonprivate")
        for name, row in rows.items():
            if all(ends):
                row["gap_closed"] = round((row["acc_cnn"] - ends[0]["acc_cnn"])
                                          / (ends[1]["acc_cnn"] - ends[0]["acc_cnn"]), 3)
            print(json.dumps({"run": name, "n_per_class": n, "overrides": args.set, **row}), flush=True)


if __name__ == "__main__":
    main()
