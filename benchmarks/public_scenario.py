"""How much does the public data alone give?  The rendered font digits scored on the test split.

The default scenario must leave room for the private data: a classifier trained
on the public data alone should fall well short of one trained on handwritten
digits.  This script renders the ``font_digits`` public source under a few
settings, trains the evaluation's CNN on each (mean and spread over seeds) and
tests it on the *test* split of a prepared ``data.h5``.  It reads no private
record: the scenario is chosen without looking at the private split.

    .venv/bin/python benchmarks/public_scenario.py --data results/mnist5k/data.h5 --seeds 3
"""

from __future__ import annotations

import argparse
import time

import torch

from dpsad.data.datafile import read_datafile
from dpsad.data.font_glyphs import render_font_digits
from dpsad.data.raw import resize_square
from dpsad.evaluation.utility import downstream_accuracy

VARIANTS = {
    "mild (rotation 12, shear 0.3, elastic 20/4, 100 per class)":
        dict(n=100, rotation=12, shear=0.3, elastic_alpha=20, elastic_sigma=4, weights=(-1, 0, 1, 2)),
    "thick strokes (weights 2-4, 100 per class)":
        dict(n=100, rotation=12, shear=0.3, elastic_alpha=20, elastic_sigma=4, weights=(2, 3, 4), box_sizes=(18, 20)),
    "default (rotation 20, shear 0.5, elastic 34/4, 200 per class)": dict(n=200),
    "default, 300 per class": dict(n=300),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a prepared data.h5 (only its test split is read)")
    parser.add_argument("--seeds", type=int, default=3, help="CNN trainings per variant")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    args = parser.parse_args()
    test = read_datafile(args.data, splits=("test",)).splits["test"]
    print("| public data | images | render s | acc_cnn on the test split (mean +- std) | acc_logreg |")
    print("|---|---|---|---|---|")
    for name in args.variants:
        options = dict(VARIANTS[name])
        n = options.pop("n")
        start = time.perf_counter()
        images, labels = render_font_digits(n, seed=0, **options)
        # at the prepared data's size, as prepare_data resizes the public source (16x16 in the default)
        images = resize_square(images[..., None], test.images.shape[1])
        render_s = time.perf_counter() - start
        torch.manual_seed(0)
        acc, _ = downstream_accuracy(images, labels, test.images, test.labels, 10, epochs=20, lr=1e-3, batch=128,
                                     holdout=0.1, seed=0, cnn_trainings=args.seeds)
        print(f"| {name} | {len(images)} | {render_s:.1f} | {acc['cnn']:.3f} +- {acc['cnn_std']:.3f} | {acc['logreg']:.3f} |",
              flush=True)
    print(f"(test split: {len(test)} handwritten digits; CNN: 20 epochs, selection on 10% of the public images)")


if __name__ == "__main__":
    main()
