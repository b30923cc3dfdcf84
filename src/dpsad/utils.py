"""Small helpers: devices, image conversions, seeded generators."""

from __future__ import annotations

import numpy as np
import torch

from .errors import DpsadError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present, then CPU.  Explicit names are checked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DpsadError(f"device '{name}' requested but CUDA is not available, expected 'auto' or 'cpu' on this machine")
    if name.startswith("cuda:") and int(name.split(":")[1]) >= torch.cuda.device_count():
        raise DpsadError(f"device '{name}' requested but this machine has {torch.cuda.device_count()} CUDA device(s), "
                         "expected 'cuda' or an index below that count")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DpsadError(f"device 'mps' requested but this torch ({torch.__version__}) has no usable MPS (Apple GPU) "
                         "backend here, expected 'auto' or 'cpu' on this machine")
    return torch.device(name)


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [N,H,W,C] -> float32 [N,C,H,W] in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def tensor_to_images(x: torch.Tensor) -> np.ndarray:
    """float [N,C,H,W] in [-1, 1] -> uint8 [N,H,W,C]."""
    x = ((x.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen

