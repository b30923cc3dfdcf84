"""MoCo's spread over seeds, as the pipeline uses it: k-means NMI on the private split (curator-only).

For each seed, MoCo trains on the public split with the configuration's ``moco``
section, k-means is fitted on the public features with its ``kmeans`` section,
and the private records' nearest-centroid labels are scored against their true
labels, as ``cluster_report.md`` does for the seed the pipeline runs.  It reads
the private labels without noise, so it chooses nothing: the MoCo defaults are
chosen on public data by ``moco_levers.py``.  Nothing it computes is released.

    .venv/bin/python benchmarks/moco_spread.py --data results/mnist5k/data.h5 --config config/config.yaml --seeds 3
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from dpsad.data.datafile import read_datafile
from dpsad.moco.cluster import fit_kmeans, nearest_centroid, scores
from dpsad.moco.train import extract_features, train_moco
from moco_levers import section_defaults


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="results/mnist5k/data.h5")
    parser.add_argument("--config", help="take the moco and kmeans settings from this file (e.g. config/config.yaml)")
    parser.add_argument("--seeds", type=int, default=3, help="MoCo trainings (seeds: the configuration's, +1, +2, ...)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    moco, kmeans = section_defaults("moco", args.config), section_defaults("kmeans", args.config)
    data = read_datafile(args.data)
    private = data.splits["train"]
    if private.labels is None:
        raise SystemExit(f"{args.data}: the private split has no labels, expected labelled data to score NMI against")
    print(f"MoCo on the {moco['split']} split, k-means (k = {kmeans['clusters']}) fitted on the {kmeans['fit_split']} "
          f"split; NMI of the {len(private)} private records' labels (curator-only)")
    print("| MoCo seed | seconds | NMI | ARI | purity |\n|---|---|---|---|---|")
    runs = []
    for offset in range(args.seeds):
        settings = {**moco, "seed": moco["seed"] + offset}
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            start = time.perf_counter()
            train_moco(data, settings, "cpu", tmp / "enc.pt", tmp / "enc.json", tmp / "loss.csv",
                       logging.getLogger("moco_spread"))
            extract_features(data, tmp / "enc.pt", "cpu", tmp / "features.h5", which=settings["features"])
            seconds = time.perf_counter() - start
            with h5py.File(tmp / "features.h5") as handle:
                fit = handle["public" if kmeans["fit_split"] == "public" else "train"]["features"][()]
                scored = handle["train"]["features"][()]
        centroids = fit_kmeans(fit, kmeans["clusters"], niter=kmeans["iterations"], nredo=kmeans["restarts"],
                               seed=kmeans["seed"])
        runs.append(scores(private.labels, nearest_centroid(scored, centroids)))
        r = runs[-1]
        print(f"| {settings['seed']} | {seconds:.0f} | {r['nmi']:.3f} | {r['ari']:.3f} | {r['purity']:.3f} |", flush=True)
    nmi = [r["nmi"] for r in runs]
    spread = f" +- {np.std(nmi, ddof=1):.3f}" if len(nmi) > 1 else ""
    print(f"NMI over {len(nmi)} seeds: mean {np.mean(nmi):.3f}{spread}, min {min(nmi):.3f}, max {max(nmi):.3f}")


if __name__ == "__main__":
    main()
