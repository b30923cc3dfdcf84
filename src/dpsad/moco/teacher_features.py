"""Features of a diffusion teacher's encoder, an alternative to MoCo's for k-means (and the cluster report)."""

from __future__ import annotations

import numpy as np
import torch

from ..privacy.books.image_digests import record_digests, stable_seed
from ..training.diffusion_training import load_diffusion_model
from ..data.image_tensors import images_to_tensor
from ..runtime.devices import make_generator


@torch.no_grad()
def teacher_features(images: np.ndarray, teacher_path, device, *, timestep: int = 25, batch: int = 500,
                     seed: int = 0) -> np.ndarray:
    """L2-normalised features of a diffusion teacher's encoder: the spatial mean of its middle block at a
    small ``timestep``, with the null (unconditional) label.  images uint8 [N,H,W,C] -> float32 [N, D].

    A cheap alternative to MoCo when a teacher trained on public data exists.  Each image's noise is drawn
    from a seed of its own content and ``seed``: a record's features do not depend on which other records
    are present or on its position (removing one record changes no other record's features or label).
    """
    model, diffusion, _ = load_diffusion_model(teacher_path, device, use_ema=True)
    captured = []
    handle = model.mid2.register_forward_hook(lambda module, args, out: captured.append(out.mean(dim=(2, 3))))
    seeds = [stable_seed(digest, seed) for digest in record_digests(images)]
    x = images_to_tensor(images)
    chunks = []
    try:
        for s in range(0, len(x), batch):
            x0 = x[s:s + batch].to(device)
            t = torch.full((len(x0),), timestep, dtype=torch.long, device=device)
            noise = torch.stack([torch.randn(x0.shape[1:], generator=make_generator(k)) for k in seeds[s:s + batch]])
            noise = noise.to(device)
            model(diffusion.q_sample(x0, t, noise), t, torch.full_like(t, model.null_class))
            chunks.append(torch.nn.functional.normalize(captured.pop(), dim=1).cpu())
    finally:
        handle.remove()
    return torch.cat(chunks).numpy().astype(np.float32) if chunks else np.zeros((0, 1), np.float32)
