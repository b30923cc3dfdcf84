"""The privacy ledger: one entry per use of private records, composed into a verdict.

An entry (a dict, stored as JSON) has the keys ``stage``, ``private`` (bool:
it read private records), ``mechanism`` (``sgm`` Poisson-subsampled Gaussian,
``gaussian`` a single Gaussian release, or ``none`` for noise-free use),
``sample_rate``, ``noise_multiplier``, ``steps``, ``clip_norm``, and
optionally ``sound`` (False when the mechanism as implemented does not meet
the SGM assumptions, e.g. the paper's output-space clipping) with ``notes``.

The verdict is ``dp_guarantee: true`` only when every private entry is a
sound noisy mechanism and the composed epsilon is at most the target.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..atomic import write_json
from ..errors import PrivacyError
from .accounting import SGMComponent, compose_epsilon

MECHANISMS = ("sgm", "gaussian", "none")
ENTRY_KEYS = ("stage", "private", "mechanism", "sample_rate", "noise_multiplier", "steps", "clip_norm")


def make_entry(*, stage: str, private: bool, mechanism: str, sample_rate: float | None = None,
               noise_multiplier: float | None = None, steps: int = 0, clip_norm: float | None = None,
               sound: bool = True, notes: str = "") -> dict:
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism '{mechanism}', expected one of {MECHANISMS}")
    return {
        "stage": stage, "private": bool(private), "mechanism": mechanism,
        "sample_rate": sample_rate, "noise_multiplier": noise_multiplier, "steps": int(steps),
        "clip_norm": clip_norm, "sound": bool(sound), "notes": notes,
    }


def write_ledger(path, entries: list[dict]) -> None:
    for entry in entries:
        missing = [k for k in ENTRY_KEYS if k not in entry]
        if missing:
            raise ValueError(f"ledger entry for '{entry.get('stage')}' lacks {missing}")
    write_json(path, {"entries": entries})


def read_ledgers(paths) -> list[dict]:
    entries = []
    for path in paths:
        entries.extend(json.loads(Path(path).read_text())["entries"])
    return entries


def _component(entry: dict, fraction: float = 1.0) -> SGMComponent:
    q = 1.0 if entry["mechanism"] == "gaussian" else float(entry["sample_rate"])
    return SGMComponent(float(entry["noise_multiplier"]), q, int(round(entry["steps"] * fraction)))


def verdict(entries: list[dict], *, delta: float, accountant: str, target_epsilon: float | None,
            num_private_records: int) -> dict:
    """Compose the private entries and decide the guarantee.  See the module docstring.

    Raises PrivacyError when the guarantee holds in form but the composed
    epsilon exceeds ``target_epsilon``: such a run must fail, not release.
    """
    reasons = []
    private = [e for e in entries if e["private"]]
    for entry in private:
        if entry["mechanism"] == "none":
            reasons.append(f"{entry['stage']}: trained on private records without noise")
        elif not entry.get("sound", True):
            reasons.append(f"{entry['stage']}: {entry.get('notes') or 'mechanism does not meet the DP-SGD assumptions'}")
    if num_private_records > 0 and delta >= 1.0 / num_private_records:
        reasons.append(f"delta = {delta:g} is not below 1/n = {1.0 / num_private_records:.3g} for n = {num_private_records}")
    noisy = [e for e in private if e["mechanism"] in ("sgm", "gaussian")]
    noisy_epsilon = compose_epsilon([_component(e) for e in noisy], delta, accountant) if noisy else 0.0
    guarantee = not reasons
    result = {
        "dp_guarantee": guarantee,
        "epsilon": (noisy_epsilon if guarantee else None),
        "delta": delta,
        "accountant": accountant,
        "target_epsilon": target_epsilon,
        "reasons": reasons,
        "num_private_records": num_private_records,
        "components": entries,
    }
    if not guarantee:
        result["epsilon_noisy_components_only"] = noisy_epsilon if math.isfinite(noisy_epsilon) else "inf"
        result["note"] = "No differential privacy guarantee: see reasons. The epsilon above covers only the noisy components and is not a guarantee."
    if guarantee and target_epsilon is not None and noisy_epsilon > target_epsilon * (1 + 1e-9):
        raise PrivacyError(
            f"composed epsilon {noisy_epsilon:.4f} exceeds the target {target_epsilon:g} at delta {delta:g}; "
            "refusing to certify this run (lower epochs or raise the noise)"
        )
    return result


def epsilon_curve(entries: list[dict], *, delta: float, accountant: str, points: int = 25) -> list[tuple[float, float]]:
    """Composed epsilon after a fraction f of every private noisy component's steps, f in (0, 1]."""
    noisy = [e for e in entries if e["private"] and e["mechanism"] in ("sgm", "gaussian")]
    curve = []
    for k in range(1, points + 1):
        fraction = k / points
        comps = [_component(e, fraction) for e in noisy]
        curve.append((fraction, compose_epsilon(comps, delta, accountant)))
    return curve
