"""The size of a DP training, chosen before any record is read: expected batch and steps.

What the rule reads is known before the data is: n (the number of private records, public by the usual
convention of DP-SGD accounting), the run's target epsilon and delta, the upstream components already
spent, and the compute the user gives, in example gradients (steps x expected batch; the time this takes
grows with the image size and the model, so on a given machine it is a time budget).

The rule (docs/defaults.md, "DP training sized from n and the budget", has the measurements behind it):

1. Hold the expected batch's signal-to-noise ratio near a target.  Each record's clipped gradient adds at
   most C to a step's sum, the noise adds sigma * C, so B / sigma measures one step's signal against its
   noise.  The batch is the smallest candidate (powers of two from ``min_batch_size``) whose B / sigma,
   with sigma calibrated to the target at steps = compute / B, reaches ``target_snr``.
2. When none reaches it (a small n or a small epsilon), the largest batch allowed:
   min(max_sample_rate * n, compute / min_steps), so that training still takes at least ``min_steps``
   steps and a record is in a given batch with probability at most ``max_sample_rate`` (a quarter).
3. The compute not needed for the batch goes to steps: steps = ceil(compute / B).

The noise multiplier is then calibrated by the accountant as for any explicit setting, and the clip bound
is not sized here (it stays the section's ``dp.clip_norm``).  Explicit values win: a section that sets
``batch_size`` keeps it (the steps then spend the compute), one that sets ``epochs`` (or, for DPDM,
``steps``) keeps that length and gets only its batch from the rule.

Privacy: the rule reads n, the budget and the configuration only, never a record, so the size it picks
discloses nothing beyond n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from . import accounting
from ..config import METHOD_KEYS
from .accounting import SGMComponent

@dataclass(frozen=True)
class DpSize:
    """A DP training's expected batch, its number of steps and the noise multiplier the accountant gave."""

    batch_size: int
    steps: int
    noise_multiplier: float
    reason: str


def candidate_batches(largest: int, smallest: int) -> list[int]:
    """Powers of two from ``smallest`` (rounded up) below ``largest``, then ``largest`` itself, ascending."""
    out, b = [], 1 << max(0, math.ceil(math.log2(max(1, smallest))))
    while b < largest:
        out.append(b)
        b *= 2
    return out + [largest]


@lru_cache(maxsize=256)
def _noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str,
                      fixed: tuple[SGMComponent, ...]) -> float:
    """The accountant's sigma for one candidate (cached: the audit and the trainings of one process ask again)."""
    return accounting.noise_for_target(target_epsilon, delta, sample_rate, steps, accountant, list(fixed))


def size_dp_training(n: int, target_epsilon: float, delta: float, *, example_gradients: int, min_steps: int,
                     target_snr: float, max_sample_rate: float, min_batch_size: int,
                     accountant: str = accounting.DEFAULT_ACCOUNTANT,
                     fixed: list[SGMComponent] | None = None) -> DpSize:
    """The rule of the module docstring for ``n`` private records; sigma is the joint mechanism's multiplier."""
    if n < 1:
        raise ValueError(f"n = {n}, expected at least one private record")
    if example_gradients < min_steps:
        raise ValueError(f"example_gradients = {example_gradients}, expected at least min_steps = {min_steps} "
                         "(one example per step)")
    largest = max(1, min(int(max_sample_rate * n), example_gradients // min_steps))
    chosen = None
    for batch in candidate_batches(largest, min(min_batch_size, largest)):
        steps = math.ceil(example_gradients / batch)
        sigma = _noise_multiplier(target_epsilon, delta, min(1.0, batch / n), steps, accountant, tuple(fixed or ()))
        chosen = DpSize(batch, steps, sigma, f"B/sigma = {batch / sigma:.1f} reaches the target {target_snr:g}")
        if batch / sigma >= target_snr:
            return chosen
    return DpSize(chosen.batch_size, chosen.steps, chosen.noise_multiplier,
                  f"B/sigma = {chosen.batch_size / chosen.noise_multiplier:.1f} stays below the target {target_snr:g}: "
                  f"the largest batch allowed (max_sample_rate {max_sample_rate:g} of n, at least {min_steps} steps)")


def sized_settings(settings: dict, method: str, n: int, target_epsilon: float, delta: float, *, log=None,
                   fixed: list[SGMComponent] | None = None) -> dict:
    """``settings`` (a DP method's section) with ``batch_size`` and ``steps`` filled where the user left them out.

    ``settings["sizing"]`` holds the dp_sizing section.  Deterministic in (settings, n, target, delta, fixed),
    so the audit of a run sizes it exactly as the run was."""
    if settings.get("batch_size") and (settings.get("epochs") or settings.get("steps")):
        return settings
    rule = settings["sizing"]
    compute_key, steps_key = METHOD_KEYS[method]
    compute, min_steps = int(rule[compute_key]), int(rule[steps_key])
    out = dict(settings)
    if settings.get("batch_size"):
        batch = int(settings["batch_size"])
        out["steps"] = max(1, math.ceil(compute / batch))
        why = f"batch_size {batch} as set; steps spend the compute of {compute} example gradients"
    else:
        size = size_dp_training(n, target_epsilon, delta, example_gradients=compute, min_steps=min_steps,
                                target_snr=float(rule["target_snr"]), max_sample_rate=float(rule["max_sample_rate"]),
                                min_batch_size=int(rule["min_batch_size"]), accountant=settings["dp"]["accountant"],
                                fixed=fixed)
        out["batch_size"] = size.batch_size
        if not settings.get("epochs") and not settings.get("steps"):
            out["steps"] = size.steps
        why = size.reason
    if log is not None:
        what = (f"{out['epochs']:g} epochs as set" if out.get("epochs")
                else f"{out['steps']} steps" + (" as set" if settings.get("steps") else ""))
        log.info("DP size (dp_sizing, n = %d, epsilon %g): expected batch %d, %s; %s", n, target_epsilon,
                 out["batch_size"], what, why)
    return out


def planned_steps(settings: dict, sample_rate: float) -> int:
    """The number of DP steps of a sized section: ``epochs`` passes in expectation when set, else ``steps``."""
    if settings.get("epochs"):
        return accounting.steps_for_epochs(settings["epochs"], sample_rate)
    return int(settings["steps"])
