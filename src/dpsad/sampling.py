"""Draw a synthetic dataset from a trained generator (teacher, non-private model or student)."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from .errors import DpsadError
from .samplers import SAMPLERS
from .utils import make_generator, tensor_to_images


def balanced_labels(num_classes: int, n_per_class: int) -> np.ndarray:
    """[0]*n + [1]*n + ... : labels balanced across classes."""
    return np.repeat(np.arange(num_classes, dtype=np.int64), n_per_class)


def generate(model, diffusion, *, num_classes: int, settings: dict, device: torch.device, progress: bool = True):
    """Return (images uint8 [N,H,W,C], labels int64 [N] or None) per the ``sample`` settings."""
    if settings["sampler"] not in SAMPLERS:
        raise DpsadError(f"sampler '{settings['sampler']}', expected one of {', '.join(SAMPLERS)}")
    if num_classes > 0:
        labels = balanced_labels(num_classes, settings["n_per_class"])
        if settings.get("n_samples"):
            labels = np.resize(labels, settings["n_samples"])
    else:
        labels = None
    total = len(labels) if labels is not None else int(settings.get("n_samples") or settings["n_per_class"] * 10)
    cfg = model.config
    gen = make_generator(settings["seed"], device)
    chunks = []
    batch = settings["batch_size"]
    for start in tqdm(range(0, total, batch), desc=f"sample ({settings['sampler']})", disable=not progress):
        size = min(batch, total - start)
        y = (torch.from_numpy(labels[start:start + size]) if labels is not None
             else torch.full((size,), model.null_class, dtype=torch.long)).to(device)
        shape = (size, cfg.in_channels, cfg.image_size, cfg.image_size)
        kwargs = {"guidance": settings["guidance"] if num_classes > 0 else 0.0, "generator": gen}
        if settings["sampler"] == "ddim":
            kwargs.update(steps=settings["steps"], eta=settings["eta"])
        x = SAMPLERS[settings["sampler"]](model, diffusion, shape, y, **kwargs)
        chunks.append(tensor_to_images(x))
    return np.concatenate(chunks), labels
