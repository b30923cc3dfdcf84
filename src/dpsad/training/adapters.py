"""Which coordinates a DP fine-tuning trains: every weight, or low-rank adapters sized from the plan.

The rule (``trainable: auto``) reads the DP plan only (its expected batch B and the update's noise multiplier
sigma, themselves from n, the budget and the compute), never a record.  One step adds noise of norm about
sigma * C * sqrt(d) on d trained coordinates against a batch signal of at most B * C, so sigma * sqrt(d) / B
is the step's noise-to-signal ratio.  Every weight is trained while the whole network keeps that ratio at most
:data:`MAX_NOISE_TO_SIGNAL`; otherwise adapters of the largest rank (a power of two, at most
:data:`MAX_RANK`) whose coordinates keep it there, or rank 1.  The bound is the ratio of the demo's DP
trainings at epsilon 10 (2.1 to 3.2 on 1,000 to 4,000 records), where training every weight did best
(docs/defaults.md).
"""

from __future__ import annotations

import math

from torch import nn

from ..errors import DpsadError
from ..models.lora import add_adapters, adapter_parameters

TRAINABLE = ("all", "conditioning", "lora", "auto")
MAX_NOISE_TO_SIGNAL = 3.5
MAX_RANK = 64


def noise_to_signal(sigma: float, coordinates: int, batch_size: float) -> float:
    """sigma * sqrt(d) / B: one step's noise norm over its largest possible summed signal (both in units of C)."""
    return sigma * math.sqrt(coordinates) / batch_size


def planned_rank(model: nn.Module, sigma: float, batch_size: float) -> int | None:
    """The rule of the module docstring: None (train every weight) or the adapters' rank."""
    full = sum(p.numel() for p in model.parameters())
    if noise_to_signal(sigma, full, batch_size) <= MAX_NOISE_TO_SIGNAL:
        return None
    rank = 1
    while rank * 2 <= MAX_RANK and noise_to_signal(sigma, adapter_parameters(model, rank * 2), batch_size) <= MAX_NOISE_TO_SIGNAL:
        rank *= 2
    return rank


def choose_trainable(model: nn.Module, trainable: str | None, lora_rank: int | None = None, *, sigma: float,
                     batch_size: float, log) -> int:
    """Apply a section's ``trainable`` (None: every weight) to ``model`` in place (adapters added for ``lora``, of
    ``lora_rank`` or the rule's, and for ``auto`` when the rule asks for them; ``conditioning`` is the caller's);
    returns the rank of the adapters or 0 (every weight)."""
    which = trainable or "all"
    if which not in TRAINABLE:
        raise DpsadError(f"trainable = {which!r}, expected one of {', '.join(TRAINABLE)}")
    if which in ("all", "conditioning"):
        return 0
    rank = lora_rank if which == "lora" else planned_rank(model, sigma, batch_size)
    if which == "lora" and not rank:
        rank = planned_rank(model, sigma, batch_size) or MAX_RANK
    full = sum(p.numel() for p in model.parameters())
    if rank is None:
        log.info("trainable auto: every weight (%d; sigma sqrt(d) / B = %.2f, at most %g)", full,
                 noise_to_signal(sigma, full, batch_size), MAX_NOISE_TO_SIGNAL)
        return 0
    add_adapters(model, int(rank))
    for name, param in model.named_parameters():  # the label rows stay trainable: a warm start may draw new ones
        if name.startswith("class_embed."):
            param.requires_grad_(True)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("trainable %s: adapters of rank %d and the label rows, %d coordinates of the %d weights (sigma sqrt(d) / B = %.2f, "
             "every weight %.2f)", which, rank, trained, full, noise_to_signal(sigma, trained, batch_size),
             noise_to_signal(sigma, full, batch_size))
    return int(rank)
