"""Images as arrays (uint8 [N,H,W,C], as stored) and as tensors (float [N,C,H,W] in [-1, 1], as trained)."""

from __future__ import annotations

import numpy as np
import torch


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [N,H,W,C] -> float32 [N,C,H,W] in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def tensor_to_images(x: torch.Tensor) -> np.ndarray:
    """float [N,C,H,W] in [-1, 1] -> uint8 [N,H,W,C]."""
    x = ((x.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()
