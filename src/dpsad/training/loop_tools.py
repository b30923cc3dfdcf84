"""Tools of any training, diffusion or GAN, that know nothing of the model: EMA, learning-rate warm-up, timestep
draws, the finiteness checks, loss logs, settings digests, reading checkpoints (the loop itself: :mod:`.loop`)."""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import math

import torch
from torch import nn

from ..config.settings import StudentSettings, TeacherSettings
from ..files.atomic import atomic_path


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
        self.decay, self.warmup = decay, 10 if warmup is None else warmup
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


def settings_digest(settings: dict) -> str:
    """A stable hash of the settings a checkpoint was trained under (resume only into the same run).

    The workflow's settings carry ``inputs_sha256`` (:func:`dpsad.jobs.stage.stage_settings`): the same run
    means the same settings and inputs of the same content."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def load_checkpoint(path, map_location="cpu", kinds: tuple[str, ...] = ()) -> dict:
    """A checkpoint written by the training loop (of one of ``kinds``, when given); truncated or foreign
    files are one-line errors."""
    from ..files.artifacts import load_torch

    return load_torch(path, map_location=map_location, kinds=kinds)


class LossLog:
    """Rows of (step, name=value, ...) kept in memory (and in resume checkpoints), written as CSV once at the end.

    Writing the CSV only when the stage finishes means a killed job leaves no
    output behind that Snakemake would have to treat as incomplete.
    """

    def __init__(self, rows: list[dict] | None = None):
        self.rows = list(rows or [])

    def add(self, **row) -> None:
        self.rows.append(row)

    def write_csv(self, path) -> None:
        if not self.rows:
            return
        fields = list(dict.fromkeys(k for row in self.rows for k in row))
        with atomic_path(path) as tmp:
            with open(tmp, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=fields)
                writer.writeheader()
                writer.writerows(self.rows)


def check_finite(value: float, step: int, checkpoint: str) -> None:
    if not math.isfinite(value):
        raise FloatingPointError(
            f"loss became {value} at step {step}, expected a finite loss; stopping. The last good checkpoint is kept "
            f"at {checkpoint} (lower the learning rate or check the data)"
        )


def check_parameters_finite(model: nn.Module, step: int, checkpoint: str) -> None:
    """Stop when a parameter became NaN or infinite.

    Under DP the decision to stop must not depend on a private loss; the
    parameters after a noisy update are already released, so testing them is free.
    """
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise FloatingPointError(
                f"parameter {name} became non-finite at step {step}; stopping, expected finite weights. The last good "
                f"checkpoint is kept at {checkpoint} (lower the learning rate)"
            )
