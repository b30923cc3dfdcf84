"""The DP plan: everything a DP training needs, fixed before it reads a record, in one call.

:func:`plan_dp_training` takes the method's section (its target epsilon and delta, its ``dp`` settings, its
batch and length or the ``dp_sizing`` rule), n, the upstream ledgers' entries and the updates that read one
Poisson batch, and returns a :class:`DpPlan`: the expected batch, the sample rate, the steps, one noise
multiplier per update, the clip bound, and the ledger entries it will write.  Every DP method (the DP-SAD
student and its discriminator, DPDM and the DP teachers, the dp-GAN critic, the audit's trainings) and the
central images' one Gaussian release are planned here; nothing else calibrates noise.

The size (expected batch and steps), where the section leaves it to ``dp_sizing``: what the rule reads is
known before the data is: n (the number of private records, public by the usual convention of DP-SGD
accounting), the run's target epsilon and delta, the upstream components already spent, and the compute
the user gives, in example gradients (steps x expected batch; the time this takes grows with the image size
and the model, so on a given machine it is a time budget).

The rule (docs/defaults.md, "DP training sized from n and the budget", has the measurements behind it):

1. Hold the expected batch's signal-to-noise ratio near a target.  Each record's clipped gradient adds at
   most C to a step's sum, the noise adds sigma * C, so B / sigma measures one step's signal against its
   noise.  The batch is the smallest candidate (powers of two from ``min_batch_size``) whose B / sigma,
   with sigma calibrated to the target at steps = compute / B, reaches ``target_snr``.
2. When none reaches it (a small n or a small epsilon), the largest batch allowed:
   min(max_sample_rate * n, compute / min_steps), so that training still takes at least ``min_steps``
   steps and a record is in a given batch with probability at most ``max_sample_rate`` (a quarter).
3. The compute not needed for the batch goes to steps: steps = ceil(compute / B).

The noise multipliers are then calibrated by the accountant as for any explicit setting, and the clip bound
is not sized here (it stays the section's ``dp.clip_norm``).  Explicit values win: a section that sets
``batch_size`` keeps it (the steps then spend the compute), one that sets ``epochs`` (or, for DPDM,
``steps``) keeps that length and gets only its batch from the rule.

Privacy: the plan reads n, the budget, the upstream ledgers and the configuration only, never a record, so
what it picks discloses nothing beyond n.  Assumptions of every plan: add/remove adjacency of one record of
the split the batches are drawn from; Poisson sampling at the plan's rate; each update that reads a batch
clips every example's whole gradient to C and adds N(0, sigma_i^2 C^2) to the sum, from secret seeds.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from functools import lru_cache

from .. import accounting
from ...config import METHOD_KEYS
from ...errors import PrivacyError
from ..accounting import SGMComponent
from ..accounting import calibration_accountant
from ..books.ledger import components_of, make_entry


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
    return accounting.noise_for_target(target_epsilon, delta, sample_rate, steps, calibration_accountant(accountant),
                                       list(fixed))


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

    ``settings["dp_sizing"]`` holds the dp_sizing section.  Deterministic in (settings, n, target, delta, fixed),
    so the audit of a run sizes it exactly as the run was."""
    if settings.get("batch_size") and (settings.get("epochs") or settings.get("steps")):
        return settings
    dp_sizing = settings["dp_sizing"]  # the YAML section, one name throughout
    compute_key, steps_key = METHOD_KEYS[method]
    compute, min_steps = int(dp_sizing[compute_key]), int(dp_sizing[steps_key])
    out = dict(settings)
    if settings.get("batch_size"):
        batch = int(settings["batch_size"])
        out["steps"] = max(1, math.ceil(compute / batch))
        why = f"batch_size {batch} as set; steps spend the compute of {compute} example gradients"
    else:
        size = size_dp_training(n, target_epsilon, delta, example_gradients=compute, min_steps=min_steps,
                                target_snr=float(dp_sizing["target_snr"]), max_sample_rate=float(dp_sizing["max_sample_rate"]),
                                min_batch_size=int(dp_sizing["min_batch_size"]), accountant=settings["dp"]["accountant"],
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


def poisson_sample_rate(batch_size: int, n: int, stage: str, log) -> float:
    """q = batch_size / n for Poisson sampling, capped at 1; a cap is said once in the log.

    q is what the accountant sees, so a cap changes the privacy cost: every record is then in every batch.
    """
    if batch_size > n:
        log.warning("%s: batch_size %d is larger than the %d records it samples from; using sample rate 1 "
                    "(every record in every batch)", stage, batch_size, n)
        return 1.0
    return batch_size / n


@dataclass(frozen=True)
class DpPlan:
    """One DP training, fixed before it reads a record.

    ``settings`` is the method's section with ``batch_size`` and ``steps`` (or ``epochs``) filled in;
    ``noise_multipliers`` has one sigma per update reading the same Poisson batch (their joint mechanism meets
    ``target_epsilon`` composed with ``upstream``); ``n`` is the number of records the plan is calibrated
    for.  An empty ``noise_multipliers`` means the caller's mechanism sets its own noise and is not DP (the
    paper's printed mechanism)."""

    stage: str
    settings: dict
    n: int
    target_epsilon: float
    delta: float
    sample_rate: float
    steps: int
    clip_norm: float
    accountant: str
    noise_multipliers: dict[str, float]
    upstream: tuple[SGMComponent, ...] = field(default=())

    @property
    def batch_size(self) -> int:
        return int(self.settings["batch_size"])

    def entries(self, stages: dict[str, str], seed_kind: str, *, clip_norms: dict[str, float] | None = None,
                notes: dict[str, str] | None = None) -> list[dict]:
        """The ledger entries of the plan's updates (``stages``: update -> ledger stage name), in that order.

        Updates that read one Poisson batch share a ``batch`` key, unique per training, so that ``account``
        composes them as one mechanism and never merges two trainings."""
        batch = f"{self.stage}:{uuid.uuid4().hex}" if len(stages) > 1 else None
        out = []
        for update, stage in stages.items():
            others = [name for name in stages if name != update]
            shared = (f"shares its Poisson batches with the {' and the '.join(others)} (one mechanism, sigma_eff)"
                      if others else "")
            note = "; ".join(part for part in ((notes or {}).get(update, ""), shared) if part)
            out.append(make_entry(stage=stage, private=True, mechanism="sgm", sample_rate=self.sample_rate,
                                  noise_multiplier=self.noise_multipliers[update], steps=self.steps,
                                  clip_norm=(clip_norms or {}).get(update, self.clip_norm), batch=batch,
                                  noise_seed=seed_kind, notes=note))
        return out


def plan_dp_training(settings: dict, method: str, *, n: int, upstream: list[dict], shares: dict[str, float] | None,
                     stage: str, log=None) -> DpPlan:
    """The plan of one DP training of ``method`` (student, dpdm or dpgan) on ``n`` private records.

    ``settings``: the method's section, with ``target_epsilon``, ``delta``, ``dp`` and ``dp_sizing`` (the
    rule's section).  ``upstream``: the ledger entries of everything the training builds on; their
    components are composed before this training's noise is calibrated.  ``shares``: update -> budget share
    of the updates that read the same Poisson batch (one update: ``{name: 1}``); None calibrates no noise
    (the paper's printed mechanism, which is not DP).  The delta < 1/n check is made here, once."""
    log = log or logging.getLogger(__name__)
    target_epsilon, delta = float(settings["target_epsilon"]), float(settings["delta"])
    if problem := accounting.delta_problem(delta, n):
        raise PrivacyError(f"{problem}, expected a smaller delta")
    fixed = components_of(upstream)
    sized = sized_settings(settings, method, n, target_epsilon, delta, log=log, fixed=fixed)
    q = poisson_sample_rate(int(sized["batch_size"]), n, stage, log)
    steps = planned_steps(sized, q)
    accountant = sized["dp"]["accountant"]
    sigmas = ({} if shares is None else
              accounting.calibrate_noise(target_epsilon, delta, sample_rate=q, steps=steps, shares=shares,
                                         accountant=calibration_accountant(accountant), fixed=fixed))
    plan = DpPlan(stage=stage, settings=sized, n=n, target_epsilon=target_epsilon, delta=delta, sample_rate=q,
                  steps=steps, clip_norm=float(sized["dp"]["clip_norm"]), accountant=accountant,
                  noise_multipliers=sigmas, upstream=tuple(fixed))
    log.info("DP plan (%s): n = %d, expected batch %d, q = %.5f, %d steps, C = %g, sigma %s; epsilon %g at delta %g "
             "with %d upstream component(s)", stage, n, plan.batch_size, q, steps, plan.clip_norm,
             {name: round(value, 4) for name, value in sigmas.items()} or "set by the caller (not DP)",
             target_epsilon, delta, len(fixed))
    return plan


def gaussian_release_noise(epsilon: float, delta: float, accountant: str) -> float:
    """The noise multiplier of one Gaussian release of every record (q = 1, one step) that costs ``epsilon``
    at ``delta``: the central images' mechanism (:mod:`dpsad.privacy.mechanism.group_means`)."""
    return accounting.noise_for_target(epsilon, delta, 1.0, 1, calibration_accountant(accountant))
