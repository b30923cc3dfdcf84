"""A DP warm-up without public data: "central images", noisy means of disjoint groups of private records.

The mechanism, one Gaussian release (ledger mechanism ``gaussian``, one step):

- each record (image x, label y) falls in one group of its own class, chosen by a keyed hash of its own
  content (:func:`groups_of_records`): the group of one record does not depend on any other record, so
  adding or removing one record changes exactly one group's sum;
- each image, in [0, 1] pixels average-pooled to ``resolution`` (a public, data-independent map that only
  shrinks l2 norms), is clipped to l2 norm C (to C(1 - ``CLIP_MARGIN``), as in DP-SGD, so that rounding in the
  norm cannot leave a clipped vector above C);
- every group's sum gets N(0, sigma^2 C^2) noise per coordinate: the Gaussian mechanism on the vector of
  all group sums, whose l2 sensitivity under add/remove of one record is C;
- the noisy sums are divided by the public nominal group size n / (K G) (n and the class count K are
  public, as everywhere here; the actual group sizes are not used).

Assumptions: the groups are disjoint (:func:`noisy_group_sums` refuses a record in two groups: the
sensitivity C would not hold); the hash key and the noise come from secret seeds.  Everything after the
release (upsampling, augmenting, training a teacher on the result) is post-processing.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import DpsadError
from .dpsgd import CLIP_MARGIN, gaussian_noise_like


def groups_of_records(digests: np.ndarray, labels: np.ndarray | None, groups_per_class: int, key: int) -> np.ndarray:
    """The group [N] of each record: class * groups_per_class + H(key, digest) mod groups_per_class.

    ``digests``: [N, 16] uint8 record digests (:mod:`dpsad.privacy.books.image_digests`); ``labels`` [N] or None (one class)."""
    salt = int(key).to_bytes(8, "little", signed=False)
    within = np.array([int.from_bytes(hashlib.blake2b(salt + bytes(d), digest_size=8).digest(), "little") % groups_per_class
                       for d in np.asarray(digests, dtype=np.uint8)], dtype=np.int64)
    classes = np.zeros(len(within), np.int64) if labels is None else np.asarray(labels, np.int64)
    return classes * groups_per_class + within


def members_of_groups(groups: np.ndarray, num_groups: int) -> list[np.ndarray]:
    """Index arrays of the records of each group, in group order (empty groups included)."""
    return [np.flatnonzero(groups == g) for g in range(num_groups)]


def pooled(images: np.ndarray, resolution: int) -> torch.Tensor:
    """uint8 [N, H, W, C] -> float [N, C, r, r] in [0, 1], average-pooled (H divisible by r, or resized)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
    return F.adaptive_avg_pool2d(x, resolution) if x.shape[-1] != resolution else x


def noisy_group_sums(x: torch.Tensor, members: list[np.ndarray], *, clip_norm: float, noise_multiplier: float,
                     generator: torch.Generator) -> torch.Tensor:
    """[G, ...] noisy sums of the records of each group: sum of clip(x_i, C) + N(0, (sigma C)^2).

    ``x``: [N, ...] one row per record.  Refuses groups that share a record (the sensitivity C assumes each
    record in one group)."""
    seen = np.concatenate([np.asarray(m, np.int64) for m in members]) if members else np.zeros(0, np.int64)
    values, counts = np.unique(seen, return_counts=True)
    if (counts > 1).any():
        record = int(values[counts > 1][0])
        raise DpsadError(f"record {record} is in {int(counts[counts > 1][0])} groups, expected disjoint groups: the "
                         f"noise sigma*C covers one record changing one group's sum by at most C")
    if len(values) and (values.min() < 0 or values.max() >= len(x)):
        raise DpsadError(f"group members index records up to {int(values.max())}, expected indices below {len(x)}")
    # float64: a group's sum of thousands of clipped rows then rounds by about 1e-16 of it, so one record moves the
    # computed sum by C to that precision (fp32 rounds a sum by about 1e-7 of it, past C's margin in a large group)
    flat = x.reshape(len(x), -1).double()
    norms = flat.norm(dim=1, keepdim=True)
    clipped = flat * torch.clamp(clip_norm * (1.0 - CLIP_MARGIN) / (norms + 1e-12), max=1.0)  # at most C after rounding
    sums = torch.stack([clipped[torch.as_tensor(m, dtype=torch.long)].sum(0) if len(m)
                        else torch.zeros(flat.shape[1], dtype=flat.dtype) for m in members])
    noise = gaussian_noise_like({"sums": sums}, noise_multiplier * clip_norm, generator)["sums"]
    return (sums + noise).float().reshape(len(members), *x.shape[1:])


def central_images(sums: torch.Tensor, nominal_size: float, image_size: int) -> np.ndarray:
    """uint8 [G, H, W, C] images from noisy group sums [G, C, r, r]: divided by the nominal group size, upsampled
    to ``image_size`` and clamped to [0, 1] (post-processing)."""
    means = sums / nominal_size
    if means.shape[-1] != image_size:
        means = F.interpolate(means, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return (means.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def augmented(images: np.ndarray, labels: np.ndarray, copies: int, max_shift: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The images and ``copies`` randomly shifted copies of each (up to ``max_shift`` pixels, public seed)."""
    rng = np.random.default_rng(seed)
    out_images, out_labels = [images], [labels]
    for _ in range(copies):
        shifts = rng.integers(-max_shift, max_shift + 1, size=(len(images), 2))
        out_images.append(np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(images, shifts)]))
        out_labels.append(labels)
    return np.concatenate(out_images), np.concatenate(out_labels)
