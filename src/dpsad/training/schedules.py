"""What a training step draws on, knowing nothing of the model: the EMA of the weights, the learning-rate
warm-up, the timestep draws."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..config.settings import DEFAULT_EMA_WARMUP, StudentSettings, TeacherSettings


class EMA:
    """Exponential moving average of parameters, with the usual warm-up of the decay.

    decay_k = min(decay, (1 + k) / (warmup + k)) at update k (``warmup`` 10 unless set), for every model,
    warm-started ones included: a constant decay of 0.99 over a DP student's 47
    steps left 0.99^47 = 62% of the EMA (the weights sampled from) at the public
    teacher, and DPDM's 0.999 over 125 steps 88%, so the private data barely
    reached the samples.  With the warm-up the start weighs under 1e-6 after 47
    updates.  ``warmup`` 2 averages the start and every update alike (while the decay stays under ``decay``).
    Averaging DP parameters is post-processing and costs no privacy.
    """

    def __init__(self, model: nn.Module, decay: float, warmup: int | None = None):
        self.decay, self.warmup = decay, DEFAULT_EMA_WARMUP if warmup is None else warmup
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = min(self.decay, (1 + self.updates) / (self.warmup + self.updates))
        # one fused update over all tensors instead of a Python loop of small kernels
        torch._foreach_lerp_(list(self.model.parameters()), [p.detach() for p in model.parameters()], 1.0 - decay)
        for ema_b, b in zip(self.model.buffers(), model.buffers()):
            ema_b.copy_(b)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "updates": self.updates, "decay": self.decay, "warmup": self.warmup}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.updates = int(state["updates"])


def warmup_cosine(total_steps: int, warmup_steps: int = 0, floor: float = 0.0):
    """LambdaLR factor: linear warm-up, then cosine annealing to ``floor``."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def draw_timesteps(diffusion, shape, gen: torch.Generator, settings: TeacherSettings | StudentSettings) -> torch.Tensor:
    """Training timesteps of ``shape`` from a stage's ``noise_distribution`` (and its log-normal's
    ``lognormal_mean``, ``lognormal_std``); independent of the data, so free of privacy cost."""
    return diffusion.sample_timesteps(shape, gen, settings.noise_distribution, settings.lognormal_mean,
                                      settings.lognormal_std)
